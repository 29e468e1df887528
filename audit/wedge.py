"""The ``wedge`` signal: work waiting while the engine makes no progress, per (boot, rank), in
receipt time. Two rules; each (boot, rank) is judged by what its ``iteration`` receipts carry.

By progress (iterations carry ``schema.PROGRESS``: tokens sampled, admissions and requests ended,
cumulative since boot). Progress is any rise of a counter, or an ``admission.admit``,
``admission.unpark``, ``request.finish`` or ``request.abort`` receipt. A span starts at an
iteration that shows work waiting (waiting + parked > 0) and no progress since it is proven by a
later iteration with the same counters, or by any receipt of the same ``iter`` (no step ran
since). A receipt of a later step proves nothing by itself (that step may have sampled tokens
without a receipt), so slow steps are never a wedge; and because the counters are cumulative, a
sampled iteration cannot hide one: the next sample shows that nothing moved.

By scheduling (iterations without the counters: engines that predate them, and ranks that wrote
no iteration): judged as before the counters existed. Waiting starts at a receipt that shows
requests held back (``admission.defer``, ``admission.park``, an iteration with waiting + parked
> 0) and ends at one that shows tokens scheduled (the progress receipts, an iteration with
running > 0) or an iteration with nothing waiting, parked or running; every receipt of the rank
measures the span so far.

A span longer than the threshold is a wedge, reported once, with the receipts at both ends.

By standing still (any engine that writes them): a ``scheduler.resume`` whose ``stalled_s`` is
past the threshold, after a ``scheduler.stall`` that held work (running, waiting or parked) or
with requests that arrived while it stood, is a wedge from the one to the other: the loop did
not turn at all, so no receipt could show the time go by.

Where the compiled loop is built (``audit.native``), ``receiver`` takes the common steps compiled
(``audit/fastwedge.c``) and hands every other receipt to ``feed``: one rule, read both ways in
``tests/unit/test_audit_fastwedge.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from audit import native
from engine.observability import schema

PROGRESS_KINDS = frozenset(
    (schema.ADMISSION_ADMIT, schema.ADMISSION_UNPARK, schema.REQUEST_FINISH, schema.REQUEST_ABORT)
)
Counters = tuple[int, ...]
# the receipts that can start a span (feed's fast path: any other changes nothing on a rank
# where no span is open)
_STARTS = frozenset((schema.ITERATION, schema.ADMISSION_DEFER, schema.ADMISSION_PARK))
_WAITS = frozenset((schema.ADMISSION_DEFER, schema.ADMISSION_PARK))  # held back: a span starts
_ENDS = PROGRESS_KINDS | {schema.BOOT_STOP}  # what ends the scheduling rule's span
_ITERATION = schema.ITERATION
_STOOD = frozenset((schema.SCHEDULER_STALL, schema.SCHEDULER_RESUME))
_NUMBER = (int, float)


class Wedge(NamedTuple):
    seconds: float
    start: dict[str, Any]  # the receipt the span starts at
    end: dict[str, Any]  # the receipt that measured it
    counters: Counters | None  # None: found by the scheduling rule (no counters)


@dataclass(slots=True)
class _Rank:
    counted: bool = False  # its iterations carry the progress counters
    since: tuple[float, dict[str, Any]] | None = None  # the scheduling rule's span
    base: tuple[float, Counters, dict[str, Any]] | None = None  # the progress rule's span
    reported: bool = False  # the progress rule's span is reported already
    waits: bool = False  # its own rule's span is open (the other receipts measure it)
    by_scheduling: list[Wedge] = field(default_factory=list)
    by_progress: list[Wedge] = field(default_factory=list)
    stall: dict[str, Any] | None = None  # the scheduler.stall its resume will close
    stood: list[Wedge] = field(default_factory=list)  # the rule of standing still


def _counters(rec: dict[str, Any]) -> Counters | None:
    got = tuple(rec.get(f) for f in schema.PROGRESS)
    return got if all(type(v) is int for v in got) else None  # type: ignore[return-value]


def _num(rec: dict[str, Any], name: str) -> float:
    v = rec.get(name)
    return v if isinstance(v, _NUMBER) and not isinstance(v, bool) else 0


def _held(rec: dict[str, Any]) -> float:
    return _num(rec, "waiting") + _num(rec, "parked")


class WedgeDetector:
    """Feed it every receipt of the log (``feed``); ``found`` lists the wedges."""

    __slots__ = ("threshold_s", "ranks", "_last")  # the compiled steps read ``_last``'s slot

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = threshold_s
        self.ranks: dict[tuple[str, int], _Rank] = {}
        self._last: tuple[Any, Any, _Rank | None] = (None, None, None)  # boot, rank, its state

    def receiver(self) -> Callable[[dict[str, Any]], None]:
        """``feed``, or where the compiled loop is at hand, the same rule with its common steps
        compiled (``audit/fastwedge.c``: it hands every other receipt to ``feed``)."""
        feeder = native.fast_feeder()
        if feeder is None:
            return self.feed
        return feeder(self, _Rank, _STOOD, _STARTS, _WAITS, _ENDS, _ITERATION, self.feed)  # type: ignore[no-any-return]

    def feed(self, rec: dict[str, Any]) -> None:
        boot, rank, r = self._last
        if rec["rank"] != rank or rec["boot"] != boot:  # lines of one rank come in runs
            boot, rank = rec["boot"], rec["rank"]
            r = self.ranks.get((boot, rank))
            self._last = boot, rank, r
        event = rec["event"]
        if event in _STOOD:
            if r is None:
                r = self.ranks[(boot, rank)] = _Rank()
                self._last = boot, rank, r
            self._stood(r, rec, event)
            return
        if r is not None and not r.waits and event not in _STARTS:
            return  # nothing waits on this rank, and this receipt cannot start a wait
        ts = rec.get("ts")
        if not isinstance(ts, _NUMBER):
            return
        if r is None:  # ranks in the order first seen: the order of ``found``
            r = self.ranks[(boot, rank)] = _Rank()
            self._last = boot, rank, r
        if not r.counted and event != _ITERATION:  # the scheduling rule's common steps, inline
            since = r.since
            if since is None and event in _WAITS:  # requests held back: a span starts
                r.since, r.waits = (ts, rec), True
                return
            if since is not None and ts - since[0] <= self.threshold_s:  # not a wedge (yet)
                if event in _ENDS:
                    r.since, r.waits = None, False
                return
        counters = _counters(rec) if event == _ITERATION else None
        # the rank's own rule: by progress once its iterations carry the counters (the
        # scheduling rule's span goes unread then), else by scheduling (and then no progress
        # span is open: only counters open one)
        if r.counted or counters is not None:
            r.counted = True
            self._by_progress(r, rec, event, ts, counters)
            r.waits = r.base is not None
        else:
            self._by_scheduling(r, rec, event, ts)
            r.waits = r.since is not None

    def found(self) -> list[Wedge]:
        """The wedges, each rank by its own rule."""
        return [
            w
            for r in self.ranks.values()
            for w in (*(r.by_progress if r.counted else r.by_scheduling), *r.stood)
        ]

    def _stood(self, r: _Rank, rec: dict[str, Any], event: str) -> None:
        if event == schema.SCHEDULER_STALL:
            r.stall = rec
            return
        stall, r.stall = r.stall, None
        seconds = _num(rec, "stalled_s")
        held = 0 if stall is None else _held(stall) + _num(stall, "running")
        if seconds > self.threshold_s and held + _num(rec, "arrived") > 0:
            r.stood.append(Wedge(seconds, stall or rec, rec, None))

    def _by_scheduling(self, r: _Rank, rec: dict[str, Any], event: str, ts: float) -> None:
        start = r.since
        if start is not None and ts - start[0] > self.threshold_s:
            if not r.by_scheduling or r.by_scheduling[-1].start is not start[1]:
                r.by_scheduling.append(Wedge(ts - start[0], start[1], rec, None))
        if event in _ENDS:
            r.since = None
        elif event == _ITERATION:
            if _num(rec, "running") > 0 or _held(rec) == 0:
                r.since = None
            elif start is None:
                r.since = (ts, rec)
        elif start is None and event in _WAITS:
            r.since = (ts, rec)

    def _by_progress(
        self, r: _Rank, rec: dict[str, Any], event: str, ts: float, counters: Counters | None
    ) -> None:
        base = r.base
        if base is None and counters is None:
            return  # nothing open, and only counters open a span
        if base is not None and not r.reported and ts - base[0] > self.threshold_s:
            it = rec.get("iter")
            still = (
                counters == base[1]
                if counters is not None
                else type(it) is int and it == base[2].get("iter")
            )
            if still:  # nothing progressed from the base to this receipt
                r.reported = True
                r.by_progress.append(Wedge(ts - base[0], base[2], rec, base[1]))
        if event in PROGRESS_KINDS:
            r.base = None
        elif counters is not None:
            if _held(rec) == 0:
                r.base = None
            elif base is None or counters != base[1]:
                r.base, r.reported = (ts, counters, rec), False
