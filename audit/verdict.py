"""Verdicts: a spec's and a report's, merged by priority (FAIL > UNDECIDED > PASS), and the one
pass that reads the logs and asks every claim of every spec for its verdict.

The verdict values themselves (``Status``, ``merge``, ``ClaimVerdict``) live in ``audit.status``,
below the checkers; they are re-exported here, where callers have always found them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit import apart, native
from audit.boot_ranks import WorldSize
from audit.checker import Bus, Checker, Context, SelCount
from audit.kinds import build_checker
from audit.live import WindowEnd
from audit.model import Spec
from audit.reader import head_receipts, scan
from audit.readstats import ReadStats
from audit.status import ClaimVerdict, Status, merge
from audit.streams import is_file
from engine.observability import schema


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
        live = (
            {}
            if self.window is None
            else {
                "live": True,
                "window_end": self.window.as_dict(self.stats.lines),
            }
        )
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


def _wanted(bus: Bus) -> frozenset[str] | None:
    """The kinds whose receipts someone on ``bus`` gets; None where a receiver needs every line
    (every receipt's, or text lines)."""
    if bus.any or any(bus.texts.values()) or any(bus.events.values()):
        return None
    return frozenset(k for k, fns in bus.kinds.items() if fns)


def _plan(specs: list[Spec], log: str | Path, n: int) -> list[list[int]]:
    """The specs shared out among ``n`` readings: what the specs' claims cost and what reading
    the log costs, both timed on its head (the reading on a second pass: the first pays once for
    loading the compiled loop and growing the process's memory, about half as much again), and
    which kinds each spec reads (a share other than the first passes over the rest, where the
    compiled loop runs). Specs whose claims keep state once for all on a bus (``Bus.shared``) go
    together, timed together."""
    head_receipts(log, HEAD_BYTES)  # cold: not timed (a smaller first reading stays as cold)
    t0 = time.perf_counter()
    head = head_receipts(log, HEAD_BYTES)  # the reader's own pass: its time is the reading's
    read = time.perf_counter() - t0
    groups = _together(specs)
    costs, kinds, movable = [], [], []
    for group in groups:
        bus = Bus()
        _subscribe([specs[i] for i in group], bus)
        costs.append(_timed(receivers(bus), head))
        wanted = _wanted(bus)
        kinds.append(wanted or frozenset())
        movable.append(wanted is not None)
    if native.fast_run() is None:  # no share passes over anything: every one reads it all
        shares = apart.share_out(costs, n)
    else:
        by_kind = Counter(rec["event"] for rec in head)
        total = max(1, len(head))

        def fraction(ks: frozenset[str]) -> float:
            return sum(by_kind[k] for k in ks) / total

        shares = apart.share_out(
            costs, n, read=read, kinds=kinds, fraction=fraction, movable=movable
        )
    return [sorted(i for g in share for i in groups[g]) for share in shares]


def _together(specs: list[Spec]) -> list[list[int]]:
    """The specs in groups, each group the specs joined by state they would share on a bus."""
    keys = []
    for spec in specs:
        bus = Bus()
        _subscribe([spec], bus)
        keys.append(bus.shared_keys())
    groups: list[tuple[set[int], set[Any]]] = []
    for i, ks in enumerate(keys):
        joined = [g for g in groups if g[1] & ks]
        merged = ({i}, set(ks))
        for g in joined:
            merged[0].update(g[0])
            merged[1].update(g[1])
            groups.remove(g)
        groups.append(merged)
    return sorted(sorted(g[0]) for g in groups)


def _timed(routes: dict[str, tuple[Callable[[dict[str, Any]], None], ...]], head: list) -> float:
    """The seconds ``routes``' receivers take over ``head``'s receipts."""
    t0 = time.perf_counter()
    try:
        for rec in head:
            for fn in routes.get(rec["event"], ()):
                fn(rec)
    except Exception:  # noqa: BLE001 (a claim that cannot take the head: as timed so far)
        pass
    return time.perf_counter() - t0


def _apart(
    specs: list[Spec],
    logs: list[str | Path],
    control: str | Path | None,
    only_applicable: bool,
    n: int,
) -> Report:
    """``evaluate`` in up to ``n`` processes, each for a share of the specs (``_plan``, on the
    first log's head); one report, the specs in their order, the reading numbers the first
    share's (which it hands the others: they pass over lines they do not read)."""
    shares = _plan(specs, logs[0], n)
    if len(shares) < 2:
        return _evaluate(specs, logs, control, only_applicable, False, False)[0]
    handoff = apart.Handoff(len(shares) - 1)

    def share(part: list[int], first: bool) -> Callable[[], Any]:
        def fn() -> Any:
            report, outcomes = _evaluate(
                [specs[i] for i in part],
                logs,
                control,
                only_applicable,
                False,
                False,
                send=handoff.send if first else None,
                receive=None if first else handoff.receive,
            )
            return (report, outcomes) if first else outcomes

        return fn

    shared = [share(p, i == 0) for i, p in enumerate(shares)]
    (report, mine), *theirs = apart.run(shared, handoff)
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
    exact = exact or not all(is_file(p) for p in logs)
    if not exact and not live and (n := apart.jobs_for(jobs, logs, len(specs))) > 1:
        return _apart(specs, logs, control, only_applicable, n)
    return _evaluate(specs, logs, control, only_applicable, live, exact)[0]


def _outcome(
    spec: Spec, row: list[Checker], app: SelCount, ranks: int, ctx: Context, only_applicable: bool
) -> Outcome:
    """A spec's verdict, or why it was left out (with ``only_applicable``). A window whose
    regime was not seen is still judged where one of its claims FAILs on lines in its engine's
    own words (an engine that died before its first stats line): a failure the log shows is
    never hidden as 'not applicable'."""
    verdicts = [ch.verdict(ctx) for ch in row]
    if only_applicable and (app.count == 0 or ranks < spec.regime.min_ranks):
        if not any(ch.failed_in_own_words(v) for ch, v in zip(row, verdicts, strict=True)):
            why = (
                f"{app.describe()} not seen"
                if app.count == 0
                else f"needs {spec.regime.min_ranks} ranks, the logs have {ranks}"
            )
            return spec.name, why
    return SpecVerdict(spec.name, spec.description, verdicts)


def _evaluate(
    specs: list[Spec],
    logs: list[str | Path],
    control: str | Path | None,
    only_applicable: bool,
    live: bool,
    exact: bool,
    upto: list[int] | None = None,
    *,
    send: Callable[[ReadStats], None] | None = None,
    receive: Callable[[], ReadStats] | None = None,
) -> tuple[Report, list[Outcome]]:
    """``evaluate`` in this process: the report, and each spec's outcome in the specs' order;
    with ``upto``, each log read no further than that many bytes. With ``send``, the reading
    numbers go there once read; with ``receive``, they come from there (another reading of the
    same logs), and lines of kinds no claim here reads are passed over."""
    bus = Bus(exact=exact)
    checkers, applies = _subscribe(specs, bus)
    world = WorldSize(bus)  # a boot that says N ranks needs N, whichever rank logs came
    window = WindowEnd(bus) if live else None
    on_text = bus.text if window is None else window.watch(bus.text)
    sizes: list[int] = []
    wanted = None if receive is None else _wanted(bus)
    skip = () if wanted is None else frozenset(schema.CATALOG) - wanted
    stats = scan(logs, on_text=on_text, routes=receivers(bus), upto=upto, sizes=sizes, skip=skip)
    if send is not None:
        send(stats)
    if receive is not None:
        stats = receive()
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
        again = None if receive is None else (lambda: stats)
        return _evaluate(specs, logs, control, only_applicable, live, True, sizes, receive=again)
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
