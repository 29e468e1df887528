"""Which receipts speak for which series of `audit report`'s time plots, with which number.

The ``iteration`` receipt is sampled: every ``iteration_receipt_interval`` steps (50 by
default), and with one rank after each step that moved the queue; an engine that wrote only the
samples, or a rank of a group between its steps with work, leaves stretches of a slow boot with
none (a first one 23 s in). Other receipts carry some of the same numbers at their own moments,
and each adds a point to the series it can speak for.

The rule: a receipt adds a point to a series only where it carries that series' number as the
same quantity the ``iteration`` receipt writes for it, and the point is at the receipt's time
(``scheduler.stall``: at its ``since``, the last turn before the loop stood; its numbers are
the work it held from then). A receipt that carries some of the numbers adds points to those
series only; a number it does not carry is never filled in (no zero for a missing field, no
value carried over from another receipt, no arithmetic across receipts).

==============  =================  ==============================================================
series          iteration field    other receipts that carry the same quantity
==============  =================  ==============================================================
free            ``avail``          ``retract`` ``available`` (when it chose its victims);
                                   one rank: ``eviction`` ``available_after``, ``alloc.oom``
                                   ``available``
evictable       ``evictable``      ``admission.admit``/``park``/``unpark``/``defer``
                                   ``evictable`` (as admission read it), ``retract``; one rank:
                                   ``eviction`` ``evictable_after`` (not with ``scope``: a
                                   host-backed pass counts only what it can reach),
                                   ``alloc.oom``
staged          ``staged``         one rank: ``alloc.oom``
cached          ``cached``         none
running         ``running``        ``scheduler.stall``
waiting         ``waiting``        ``scheduler.stall``, ``relief.throttle``, ``admission.defer``
                                   ``count`` (the line left waiting; not when the defer names a
                                   ``rid``: that one counts the in-flight chunk it held)
parked          ``parked``         ``scheduler.stall``
progress        ``schema.PROGRESS``  none (cumulative since boot: only the iteration counts)
==============  =================  ==============================================================

Left out on purpose: admission's ``local_avail`` (available less the slots the step's decodes
are about to take: a budget term, not the pool's free layer); the ``running`` of
``admission.defer`` and ``relief.throttle`` (parked requests counted in); ``eviction``'s
``staged`` (what that eviction staged, not the pool's); ``group.floor``'s terms (the MIN over
ranks, drawn in their own figure); cutover censuses.

One rank only: ``eviction`` and ``alloc.oom`` read the rank's own allocator and cache, where the
iteration writes memory's numbers (agreed across a group: its surplus taken off); the two are
the same quantity in a boot of one rank, so these count only there (one rank seen in the logs
and at most one declared by ``boot.start``'s ``config.tp``).

The stacked pool figure needs every layer at one moment, so it is drawn from iterations alone;
the per-layer figure and the queue from every point.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NamedTuple

from engine.observability import schema

POOL_SERIES = ("free", "evictable", "staged", "cached")
QUEUE_SERIES = ("waiting", "running", "parked")
PROGRESS_SERIES = schema.PROGRESS

_EVICTABLE = (("evictable", "evictable"),)
# kind -> (series, the receipt's field): the table of the docstring
CARRIERS: dict[str, tuple[tuple[str, str], ...]] = {
    schema.ITERATION: (
        ("free", "avail"), ("evictable", "evictable"), ("staged", "staged"),
        ("cached", "cached"), *((s, s) for s in QUEUE_SERIES), *((p, p) for p in PROGRESS_SERIES),
    ),
    schema.SCHEDULER_STALL: tuple((s, s) for s in QUEUE_SERIES),
    schema.ADMISSION_ADMIT: _EVICTABLE,
    schema.ADMISSION_PARK: _EVICTABLE,
    schema.ADMISSION_UNPARK: _EVICTABLE,
    schema.ADMISSION_DEFER: (*_EVICTABLE, ("waiting", "count")),
    schema.RETRACT: (("free", "available"), *_EVICTABLE),
    schema.RELIEF_THROTTLE: (("waiting", "waiting"),),
}  # fmt: skip
# the rank's own allocator and cache: the same quantity as memory's only in a boot of one rank
RANK_LOCAL: dict[str, tuple[tuple[str, str], ...]] = {
    schema.EVICTION: (("free", "available_after"), ("evictable", "evictable_after")),
    schema.ALLOC_OOM: (("free", "available"), ("staged", "staged"), *_EVICTABLE),
}
# (kind, series) -> a field whose presence means the number is another quantity
UNLESS = {(schema.ADMISSION_DEFER, "waiting"): "rid", (schema.EVICTION, "evictable"): "scope"}
AT = {schema.SCHEDULER_STALL: "since"}  # the time the receipt's numbers belong to


class Point(NamedTuple):
    t: float
    value: int
    kind: str  # the receipt that carried it (the hover names it)


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _time(rec: dict[str, Any], ts: float) -> float:
    at = AT.get(rec["event"])
    v = rec.get(at) if at else None
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else ts


def points(rec: dict[str, Any], ts: float) -> Iterator[tuple[str, Point, bool]]:
    """(series, point, rank-local) for each number ``rec`` carries for a series."""
    kind = rec["event"]
    local = kind in RANK_LOCAL
    fields = RANK_LOCAL[kind] if local else CARRIERS.get(kind, ())
    if not fields:
        return
    t = _time(rec, ts)
    for series, name in fields:
        unless = UNLESS.get((kind, series))
        value = _count(rec.get(name))
        if value is not None and (unless is None or unless not in rec):
            yield series, Point(t, value, kind), local
