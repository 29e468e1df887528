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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from engine.obs import schema

PROGRESS_KINDS = frozenset(
    (schema.ADMISSION_ADMIT, schema.ADMISSION_UNPARK, schema.REQUEST_FINISH, schema.REQUEST_ABORT)
)
Counters = tuple[int, ...]
# the receipts that can start a span (feed's fast path: any other changes nothing on a rank
# where no span is open)
_STARTS = frozenset((schema.ITERATION, schema.ADMISSION_DEFER, schema.ADMISSION_PARK))


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
    by_scheduling: list[Wedge] = field(default_factory=list)
    by_progress: list[Wedge] = field(default_factory=list)


def _counters(rec: dict[str, Any]) -> Counters | None:
    got = tuple(rec.get(f) for f in schema.PROGRESS)
    return got if all(type(v) is int for v in got) else None  # type: ignore[return-value]


def _num(rec: dict[str, Any], name: str) -> float:
    v = rec.get(name)
    return v if isinstance(v, int | float) and not isinstance(v, bool) else 0


def _held(rec: dict[str, Any]) -> float:
    return _num(rec, "waiting") + _num(rec, "parked")


class WedgeDetector:
    """Feed it every receipt of the log (``feed``); ``found`` lists the wedges."""

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = threshold_s
        self.ranks: dict[tuple[str, int], _Rank] = {}

    def feed(self, rec: dict[str, Any]) -> None:
        r = self.ranks.get((rec["boot"], rec["rank"]))
        if r is not None and rec["event"] not in _STARTS:
            # the rank's own rule's span: by progress once its iterations carry the counters
            # (the scheduling rule's span goes unread then), else by scheduling (and then no
            # progress span is open: only counters open one)
            start, done = (r.base, r.reported) if r.counted else (r.since, False)
            if start is None:
                return  # nothing waits on this rank and this receipt cannot start a wait
            ts = rec.get("ts")
            if not isinstance(ts, int | float):
                return
            if done or ts - start[0] <= self.threshold_s:  # nothing to measure: it may end it
                if rec["event"] in PROGRESS_KINDS:
                    r.base = r.since = None
                elif rec["event"] == schema.BOOT_STOP and not r.counted:
                    r.since = None
                return
        ts = rec.get("ts")
        if not isinstance(ts, int | float):
            return
        if r is None:
            r = self.ranks[(rec["boot"], rec["rank"])] = _Rank()
        counters = _counters(rec) if rec["event"] == schema.ITERATION else None
        r.counted |= counters is not None
        self._by_scheduling(r, rec, ts)
        self._by_progress(r, rec, ts, counters)

    def found(self) -> list[Wedge]:
        """The wedges, each rank by its own rule."""
        return [
            w
            for r in self.ranks.values()
            for w in (r.by_progress if r.counted else r.by_scheduling)
        ]

    def _by_scheduling(self, r: _Rank, rec: dict[str, Any], ts: float) -> None:
        start = r.since
        if start is not None and ts - start[0] > self.threshold_s:
            if not r.by_scheduling or r.by_scheduling[-1].start is not start[1]:
                r.by_scheduling.append(Wedge(ts - start[0], start[1], rec, None))
        event = rec["event"]
        if event in PROGRESS_KINDS or event == schema.BOOT_STOP:
            r.since = None
        elif event == schema.ITERATION:
            if _num(rec, "running") > 0 or _held(rec) == 0:
                r.since = None
            elif start is None:
                r.since = (ts, rec)
        elif event in (schema.ADMISSION_DEFER, schema.ADMISSION_PARK) and start is None:
            r.since = (ts, rec)

    def _by_progress(
        self, r: _Rank, rec: dict[str, Any], ts: float, counters: Counters | None
    ) -> None:
        base = r.base
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
        if rec["event"] in PROGRESS_KINDS:
            r.base = None
        elif counters is not None:
            if _held(rec) == 0:
                r.base = None
            elif base is None or counters != base[1]:
                r.base, r.reported = (ts, counters, rec), False
