"""Self-test: every spec's cases (small logs with the verdict each claim must get) are run, and
every claim must have a case that makes it FAIL (where its kind can fail) and one that makes it
UNDECIDED, and a claim with ``applies`` one where it is N/A. A spec whose claims cannot be shown
to fail proves nothing when they pass.

A case is ``cases/<name>.toml``: ``description``, ``log`` (the log text), optional ``control``
(a control log's text), and ``[expect]`` with ``overall``, ``claims`` (claim id -> verdict, for
every claim of the spec), optional ``reasons`` (claim id -> reason code) and optional
``applies`` (true or false: whether ``audit verdict`` without ``--spec``, which judges only the
windows that apply to a log, judges this one for this log).
"""

from __future__ import annotations

import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from audit import kinds
from audit.model import Spec
from audit.parse import SpecError
from audit.status import Status
from audit.verdict import evaluate


@dataclass(slots=True)
class CaseResult:
    name: str
    problems: list[str]
    got: dict[str, str] = field(default_factory=dict)
    expected: dict[str, str] = field(default_factory=dict)  # what the case file states


@dataclass(slots=True)
class SelfTest:
    spec: str
    cases: list[CaseResult]
    coverage: list[str]  # claims lacking a FAIL or an UNDECIDED case

    @property
    def ok(self) -> bool:
        return not self.coverage and all(not c.problems for c in self.cases)


def _load_case(path: Path) -> dict:
    try:
        t = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{path}: not a readable case: {e}") from None
    exp = t.get("expect")
    if not isinstance(t.get("log"), str) or not isinstance(exp, dict):
        raise SpecError(f"{path}: a case needs 'log' (text) and an [expect] table")
    return t


def case_paths(spec: Spec) -> list[Path]:
    """A spec's cases, in name order."""
    return sorted((spec.path.parent / "cases").glob("*.toml"))


@contextmanager
def case_files(path: Path) -> Iterator[tuple[dict, Path, Path | None]]:
    """A case's table and its logs written out: (table, log, control log or None), removed when
    done."""
    t = _load_case(path)
    with tempfile.TemporaryDirectory(prefix="audit-case-") as d:
        log = Path(d) / "case.log"
        log.write_text(t["log"], encoding="utf-8")
        control = None
        if isinstance(t.get("control"), str):
            control = Path(d) / "control.log"
            control.write_text(t["control"], encoding="utf-8")
        yield t, log, control


def run_case(spec: Spec, path: Path) -> CaseResult:
    with case_files(path) as (t, log, control):
        report = evaluate([spec], [log], control)
        exp = t["expect"]
        problems: list[str] = []
        if "applies" in exp:
            picked = evaluate([spec], [log], control, only_applicable=True)
            if bool(picked.specs) != exp["applies"]:
                said = "judged" if picked.specs else "left out as not applying"
                problems.append(f"applies: expected {exp['applies']}, the window was {said}")
    claims = {c.id for c in spec.claims}
    expected = exp.get("claims", {})
    for cid in sorted(claims - set(expected)):
        problems.append(f"states no expected verdict for claim {cid}")
    for cid in sorted(set(expected) - claims):
        problems.append(f"expects a verdict for {cid}, which the spec does not have")
    got = {cv.claim: cv for cv in report.specs[0].claims}
    for cid, want in expected.items():
        cv = got.get(cid)
        if cv is not None and cv.status.value != want:
            problems.append(
                f"{cid}: expected {want}, got {cv.status.value} ({cv.reason}): {cv.why}"
            )
    for cid, want in exp.get("reasons", {}).items():
        cv = got.get(cid)
        if cv is not None and cv.reason != want:
            problems.append(f"{cid}: expected reason {want}, got {cv.reason}")
    overall = report.status.value
    if exp.get("overall") != overall:
        problems.append(f"overall: expected {exp.get('overall')}, got {overall}")
    return CaseResult(
        path.stem, problems, {k: v.status.value for k, v in got.items()}, dict(expected)
    )


def self_test(spec: Spec) -> SelfTest:
    paths = case_paths(spec)
    results = [run_case(spec, p) for p in paths]
    seen: dict[str, set[str]] = {c.id: set() for c in spec.claims}
    for r in results:
        for cid, want in r.expected.items():
            if cid in seen and r.got.get(cid) == want:  # only a case that agrees counts
                seen[cid].add(want)
    coverage = []
    for c in spec.claims:
        if kinds.KINDS[c.kind].can_fail and Status.FAIL.value not in seen[c.id]:
            coverage.append(f"{c.id}: no case makes it FAIL")
        if Status.UNDECIDED.value not in seen[c.id]:
            coverage.append(f"{c.id}: no case makes it UNDECIDED")
        if c.applies and Status.NOT_APPLICABLE.value not in seen[c.id]:
            coverage.append(f"{c.id}: no case makes it N/A")
    if not paths:
        coverage.append(f"no cases in {spec.path.parent / 'cases'}")
    return SelfTest(spec.name, results, coverage)
