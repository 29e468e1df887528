"""Verdicts: three values merged by priority (FAIL > UNDECIDED > PASS), and the one pass that
reads the logs and asks every claim of every spec for its verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from audit.reader import ReadStats, scan
from audit.spec import Spec


class Status(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNDECIDED = "UNDECIDED"

    @property
    def exit_code(self) -> int:
        return {Status.PASS: 0, Status.FAIL: 1, Status.UNDECIDED: 2}[self]


_RANK = {Status.PASS: 0, Status.UNDECIDED: 1, Status.FAIL: 2}


def merge(statuses: list[Status]) -> Status:
    """FAIL if any failed, else UNDECIDED if any is undecided, else PASS. Nothing to merge is
    UNDECIDED: no claim was decided."""
    if not statuses:
        return Status.UNDECIDED
    return max(statuses, key=_RANK.__getitem__)


@dataclass(slots=True)
class ClaimVerdict:
    claim: str
    kind: str
    status: Status
    why: str  # one sentence, with the numbers
    reason: str | None = None  # a code for every UNDECIDED (and "vacuous" on an allowed pass)
    numbers: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "kind": self.kind,
            "verdict": self.status.value,
            "reason": self.reason,
            "why": self.why,
            "numbers": self.numbers,
        }


@dataclass(slots=True)
class SpecVerdict:
    spec: str
    description: str
    claims: list[ClaimVerdict]

    @property
    def status(self) -> Status:
        return merge([c.status for c in self.claims])

    def as_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "description": self.description,
            "verdict": self.status.value,
            "claims": [c.as_dict() for c in self.claims],
        }


@dataclass(slots=True)
class Report:
    logs: list[str]
    specs: list[SpecVerdict]
    stats: ReadStats
    control: str | None = None
    control_stats: ReadStats | None = None
    not_applicable: list[tuple[str, str]] = field(default_factory=list)  # (spec, why)

    @property
    def status(self) -> Status:
        return merge([s.status for s in self.specs])

    def as_dict(self) -> dict[str, Any]:
        incomplete = self.stats.incomplete()
        return {
            "verdict": self.status.value,
            "exit_code": self.status.exit_code,
            "logs": self.logs,
            "control": self.control,
            "read": self.stats.as_dict(),
            "complete": incomplete is None,
            "incomplete": None
            if incomplete is None
            else {"reason": incomplete[0], "why": incomplete[1]},
            "control_read": None if self.control_stats is None else self.control_stats.as_dict(),
            "specs": [s.as_dict() for s in self.specs],
            "not_applicable": [{"spec": s, "why": w} for s, w in self.not_applicable],
        }


def evaluate(
    specs: list[Spec],
    logs: list[str | Path],
    control: str | Path | None = None,
    *,
    only_applicable: bool = False,
) -> Report:
    """Read ``logs`` once and decide every claim of every spec. With ``only_applicable``, specs
    whose regime does not apply to these logs are left out (and listed as such)."""
    from audit.claims import Bus, Context, SelCount, build_checker

    bus = Bus()
    checkers = [[build_checker(c, bus) for c in s.claims] for s in specs]
    applies = [SelCount(s.regime.applies, bus) for s in specs]
    stats = scan(logs, bus.receipt, bus.text)
    control_stats = None
    if control is not None:
        cbus = Bus()
        for row in checkers:
            for ch in row:
                ch.subscribe_control(cbus)
        control_stats = scan([control], cbus.receipt, cbus.text)
    ctx = Context(stats=stats, control_stats=control_stats)
    out, skipped = [], []
    for spec, row, app in zip(specs, checkers, applies):
        ranks = len(stats.ranks)
        if only_applicable and (app.count == 0 or ranks < spec.regime.min_ranks):
            why = (
                f"{app.describe()} not seen"
                if app.count == 0
                else f"needs {spec.regime.min_ranks} ranks, the log has {ranks}"
            )
            skipped.append((spec.name, why))
            continue
        out.append(SpecVerdict(spec.name, spec.description, [ch.verdict(ctx) for ch in row]))
    return Report(
        logs=[str(p) for p in logs],
        specs=out,
        stats=stats,
        control=None if control is None else str(control),
        control_stats=control_stats,
        not_applicable=skipped,
    )
