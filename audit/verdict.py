"""Verdicts: a spec's and a report's, merged by priority (FAIL > UNDECIDED > PASS), and the one
pass that reads the logs and asks every claim of every spec for its verdict.

The verdict values themselves (``Status``, ``merge``, ``ClaimVerdict``) live in ``audit.status``,
below the checkers; they are re-exported here, where callers have always found them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit import apart
from audit.boot_ranks import WorldSize
from audit.checker import Bus, Checker, Context, SelCount
from audit.kinds import build_checker
from audit.live import WindowEnd
from audit.model import Spec
from audit.reader import head_receipts, scan
from audit.readstats import ReadStats
from audit.status import ClaimVerdict, Status, merge
from engine.obs import schema


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
    window: WindowEnd | None = None  # a live window's end (``audit.live``); None: not live

    @property
    def status(self) -> Status:
        return merge([s.status for s in self.specs])

    def as_dict(self) -> dict[str, Any]:
        incomplete = self.stats.incomplete()
        live = {} if self.window is None else {
            "live": True, "window_end": self.window.as_dict(self.stats.lines),
        }  # fmt: skip
        return {
            "verdict": self.status.value,
            "exit_code": self.status.exit_code,
            **live,
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


def receivers(bus: Bus) -> dict[str, tuple[Callable[[dict[str, Any]], None], ...]]:
    """Who gets each kind's receipts, in the order ``Bus.receipt`` calls them (by kind, then
    every receipt's): the reader makes one lookup a receipt instead of a call and two loops."""
    kinds = set(bus.kinds) | (set(schema.CATALOG) if bus.any else set())
    return {k: (*bus.kinds.get(k, ()), *bus.any) for k in kinds}


Outcome = SpecVerdict | tuple[str, str]  # a spec's verdict, or (its name, why it was left out)


HEAD_BYTES = 2 << 20  # the head of a log the shares' costs are timed on


def _costs(specs: list[Spec], log: str | Path) -> list[float]:
    """What each spec's claims cost, timed on the receipts of the log's head (read once): the
    calls its claims make are most of what a share adds to the reading it repeats."""
    head = head_receipts(log, HEAD_BYTES)
    costs = []
    for spec in specs:
        bus = Bus()
        _subscribe([spec], bus)
        routes = receivers(bus)
        t0 = time.perf_counter()
        try:
            for rec in head:
                for fn in routes.get(rec["event"], ()):
                    fn(rec)
        except Exception:  # noqa: BLE001 (a claim that cannot take the head: as timed so far)
            pass
        costs.append(time.perf_counter() - t0)
    return costs


def _apart(
    specs: list[Spec],
    logs: list[str | Path],
    control: str | Path | None,
    only_applicable: bool,
    n: int,
) -> Report:
    """``evaluate`` in up to ``n`` processes, each for a share of the specs (shared out by
    ``_costs``, timed on the first log's head); one report, the specs in their order, the
    reading numbers this process's (every process reads the same)."""
    shares = apart.share_out(_costs(specs, logs[0]), n)

    def share(part: list[int], whole: bool) -> Callable[[], Any]:
        def fn() -> Any:
            report, outcomes = _evaluate(
                [specs[i] for i in part], logs, control, only_applicable, False, False
            )
            return (report, outcomes) if whole else outcomes

        return fn

    (report, mine), *theirs = apart.run([share(p, i == 0) for i, p in enumerate(shares)])
    by_index = dict(zip(shares[0], mine))
    for part, outcomes in zip(shares[1:], theirs):
        by_index.update(zip(part, outcomes))
    _place(report, [by_index[i] for i in sorted(by_index)])
    return report


def _subscribe(specs: list[Spec], bus: Bus) -> tuple[list[list[Checker]], list[SelCount]]:
    """Each spec's checkers, and what its regime applies to, subscribed on ``bus``."""
    checkers = [[build_checker(c, bus) for c in s.claims] for s in specs]
    return checkers, [SelCount(s.regime.applies, bus) for s in specs]


def _place(report: Report, outcomes: list[Outcome]) -> None:
    """The specs' outcomes into the report: the verdicts, and the specs left out."""
    report.specs = [o for o in outcomes if isinstance(o, SpecVerdict)]
    report.not_applicable = [o for o in outcomes if isinstance(o, tuple)]


def evaluate(
    specs: list[Spec],
    logs: list[str | Path],
    control: str | Path | None = None,
    *,
    only_applicable: bool = False,
    live: bool = False,
    exact: bool = False,
    jobs: int = 1,
) -> Report:
    """Read ``logs`` once and decide every claim of every spec. With ``only_applicable``, specs
    whose regime does not apply to these logs are left out (and listed as such). With ``live``,
    the logs are a running server's, judged as a window that ends at their last line
    (``audit.live``; the control log, a finished run, is read as ever). Claims keep no more than
    what these logs can need (``Bus.exact``); where that proves too little, the logs are read
    again, as far as they were read, keeping everything (a log that is not a regular file is
    read that way at once). With ``jobs`` other than 1 (0: as many as the cores, for a big log),
    the specs are shared among processes that each read the logs (``_apart``)."""
    # what is not a regular file may read once: it cannot be read again (a live log can: as far
    # as it was read)
    exact = exact or not all(Path(p).is_file() for p in logs)
    if not exact and not live and (n := apart.jobs_for(jobs, logs, len(specs))) > 1:
        return _apart(specs, logs, control, only_applicable, n)
    return _evaluate(specs, logs, control, only_applicable, live, exact)[0]


def _outcome(
    spec: Spec, row: list[Checker], app: SelCount, ranks: int, ctx: Context, only_applicable: bool
) -> Outcome:
    """A spec's verdict, or why it was left out (with ``only_applicable``)."""
    if only_applicable and (app.count == 0 or ranks < spec.regime.min_ranks):
        why = (
            f"{app.describe()} not seen"
            if app.count == 0
            else f"needs {spec.regime.min_ranks} ranks, the logs have {ranks}"
        )
        return spec.name, why
    return SpecVerdict(spec.name, spec.description, [ch.verdict(ctx) for ch in row])


def _evaluate(
    specs: list[Spec],
    logs: list[str | Path],
    control: str | Path | None,
    only_applicable: bool,
    live: bool,
    exact: bool,
    upto: list[int] | None = None,
) -> tuple[Report, list[Outcome]]:
    """``evaluate`` in this process: the report, and each spec's outcome in the specs' order;
    with ``upto``, each log read no further than that many bytes."""
    bus = Bus(exact=exact)
    checkers, applies = _subscribe(specs, bus)
    world = WorldSize(bus)  # a boot that says N ranks needs N, whichever rank logs came
    window = WindowEnd(bus) if live else None
    on_text = bus.text if window is None else window.watch(bus.text)
    sizes: list[int] = []
    stats = scan(logs, on_text=on_text, routes=receivers(bus), upto=upto, sizes=sizes)
    control_stats = None
    if control is not None:
        cbus = Bus()
        for row in checkers:
            for ch in row:
                ch.subscribe_control(cbus)
        control_stats = scan([control], on_text=cbus.text, routes=receivers(cbus))
    ctx = Context(stats=stats, control_stats=control_stats, live=live)
    if not exact and any(ch.rescan(ctx) for row in checkers for ch in row):
        # read again as far as read (a live log has grown since): the same lines, all kept
        return _evaluate(specs, logs, control, only_applicable, live, True, sizes)
    ranks = max(len(stats.ranks), world.most())
    outcomes = [
        _outcome(spec, row, app, ranks, ctx, only_applicable)
        for spec, row, app in zip(specs, checkers, applies)
    ]
    report = Report(
        logs=[str(p) for p in logs],
        specs=[],
        stats=stats,
        control=None if control is None else str(control),
        control_stats=control_stats,
        window=window,
    )
    _place(report, outcomes)
    return report, outcomes
