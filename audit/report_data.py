"""What `audit report` draws, read from boot logs in one pass (pure data; no plotting here).

The stacked pool layers come from ``iteration`` receipts (every layer at one moment), the pool's
size from ``boot.pool_sized``; each pool layer, the queue's counts and the progress counters
over time come from every receipt that carries them (``series``: which receipts speak for which
series is `audit/report_series.py`'s rule); stalls are spans from a ``scheduler.stall``'s
``since`` to the ``scheduler.resume`` after it; pressure events (parks, retractions, evictions,
relief rungs, ...) are placed on a timeline by their ``ts``; latencies come from
``request.finish``. Series are kept per (boot, rank), so two ranks or two boots in one log are
drawn side by side, never summed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.boot_ranks import declared_ranks
from audit.explain import detail
from audit.reader import scan
from audit.readstats import ReadStats
from audit.report_series import Point, points
from engine.observability import schema

Key = tuple[str, int]  # (boot, rank)

# The timeline's lanes, top to bottom: which receipt kinds each lane shows. Lanes listed here are
# drawn even when empty, so "no retraction" is visible rather than a missing row.
LANES: dict[str, tuple[str, ...]] = {
    "park": (schema.ADMISSION_PARK,),
    "unpark": (schema.ADMISSION_UNPARK,),
    "retract": (schema.RETRACT,),
    "eviction": (schema.EVICTION,),
    "eviction under-delivered": (schema.EVICTION_UNDER_DELIVERED,),
    "relief engage": (schema.RELIEF_ENGAGE,),
    "relief rung": (schema.RELIEF_RUNG,),
    "allocation net": (schema.ALLOC_FLUSH, schema.ALLOC_RELIEF, schema.ALLOC_RETRY),
    "alloc.oom": (schema.ALLOC_OOM,),
    "abort / reject": (schema.REQUEST_ABORT, schema.REQUEST_REJECT),
    "invariant violation": (schema.INVARIANT_VIOLATION,),
}
_LANE_OF = {kind: lane for lane, kinds in LANES.items() for kind in kinds}
# Vertical lines across the time plots: boots, stops, and any cutover kind the schema grows.
CUTOVER_KINDS = tuple(k for k in schema.CATALOG if k.startswith("cutover"))
_MARKERS = (schema.BOOT_START, schema.BOOT_STOP, *CUTOVER_KINDS)
MAX_EVENTS_PER_LANE = 20_000  # beyond this a lane keeps the first ones and says how many it left


@dataclass(slots=True)
class PoolSample:
    """One ``iteration`` receipt, its pool split into layers that add up to the capacity:
    ``used`` (private to requests) + ``cached_held`` (cached, locked by running requests) +
    ``evictable`` + ``staged`` + ``free``. ``used`` is None when the pool's size is unknown."""

    t: float
    free: int
    staged: int
    evictable: int
    cached_held: int
    used: int | None
    running: int
    waiting: int
    parked: int


@dataclass(slots=True)
class Event:
    t: float
    kind: str
    rank: int
    text: str  # the receipt's decision fields, for the hover


@dataclass(slots=True)
class Stall:
    """The scheduler's loop stood still on a rank: from ``since`` (its last turn) to the
    ``scheduler.resume`` after it (``until``; the stall's own ts where no resume follows)."""

    key: Key
    since: float
    until: float
    stalled_s: float | None  # the resume's; None where no resume follows
    text: str  # what it held and who arrived meanwhile, for the figures


@dataclass(slots=True)
class ReportData:
    stats: ReadStats
    t0: float | None = None  # the earliest receipt's ts: every time axis starts here
    capacity: dict[Key, int] = field(default_factory=dict)
    pool: dict[Key, list[PoolSample]] = field(default_factory=dict)  # iterations: the stack
    series: dict[Key, dict[str, list[Point]]] = field(default_factory=dict)  # in time order
    stalls: list[Stall] = field(default_factory=list)
    lanes: dict[str, list[Event]] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)  # lane -> events beyond the cap
    markers: list[Event] = field(default_factory=list)
    latency: dict[str, list[float]] = field(default_factory=dict)  # ttft_s, e2e_s, queue_s
    floors: dict[int, list[tuple[float, float | None, float]]] = field(default_factory=dict)

    def rel(self, ts: float) -> float:
        """Seconds since the first receipt."""
        return ts - (self.t0 or 0.0)

    def label(self, key: Key) -> str:
        """``rank R``, with the boot when the logs hold more than one."""
        boots = {b for b, _ in self.stats.seqs}
        return f"rank {key[1]}" if len(boots) <= 1 else f"{key[0]} rank {key[1]}"

    def kinds_by_rank(self) -> dict[str, dict[int, int]]:
        table: dict[str, dict[int, int]] = defaultdict(dict)
        for (rank, kind), n in self.stats.kinds.items():
            table[kind][rank] = n
        return dict(sorted(table.items()))


def _num(rec: dict[str, Any], name: str) -> int:
    v = rec.get(name)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


def _ts(rec: dict[str, Any]) -> float | None:
    ts = rec.get("ts")
    return float(ts) if isinstance(ts, int | float) and math.isfinite(ts) else None


def pool_sample(rec: dict[str, Any], t: float, capacity: int | None) -> PoolSample:
    """The layers of one ``iteration`` receipt (``capacity`` from ``boot.pool_sized``)."""
    free, staged = _num(rec, "avail"), _num(rec, "staged")
    cached, evictable = _num(rec, "cached"), _num(rec, "evictable")
    used = None if capacity is None else capacity - free - staged - cached
    return PoolSample(
        t=t,
        free=free,
        staged=staged,
        evictable=evictable,
        cached_held=cached - evictable,
        used=used,
        running=_num(rec, "running"),
        waiting=_num(rec, "waiting"),
        parked=_num(rec, "parked"),
    )


def pool_capacity(rec: dict[str, Any]) -> int | None:
    """The allocator's capacity from ``boot.pool_sized``: whole pages only."""
    tokens, page = rec.get("kv_tokens"), rec.get("page_size") or 1
    if not isinstance(tokens, int) or not isinstance(page, int) or page < 1:
        return None
    return tokens // page * page


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (``q`` in 0..100): a value that occurred (p100 is the
    maximum); None when there are none."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def _held(rec: dict[str, Any]) -> str:
    return ", ".join(f"{_shown(rec.get(n))} {n}" for n in ("running", "waiting", "parked"))


def _shown(v: object) -> object:
    return v if isinstance(v, int | float) and not isinstance(v, bool) else "?"


class _Stalls:
    """Pairs each ``scheduler.stall`` with the ``scheduler.resume`` after it, per rank."""

    def __init__(self) -> None:
        self.open: dict[Key, Stall] = {}
        self.done: list[Stall] = []

    def stall(self, key: Key, t: float, rec: dict[str, Any]) -> None:
        since = rec.get("since")
        since = float(since) if isinstance(since, int | float) and math.isfinite(since) else t
        self.open[key] = Stall(key, min(since, t), t, None, f"held {_held(rec)}")

    def resume(self, key: Key, t: float, rec: dict[str, Any]) -> None:
        s, stalled = self.open.pop(key, None), rec.get("stalled_s")
        stalled = float(stalled) if isinstance(stalled, int | float) else None
        if s is None:  # its stall line is lost: the resume says how long it stood
            if stalled is None or not math.isfinite(stalled) or stalled < 0:
                return
            s = Stall(key, t - stalled, t, None, "its scheduler.stall is not in the log")
        s.until, s.stalled_s = t, stalled
        s.text += f"; {_shown(rec.get('arrived'))} arrived"
        self.done.append(s)

    def all(self) -> list[Stall]:
        for s in self.open.values():
            s.text += "; no scheduler.resume follows in the log"
        return sorted(self.done + list(self.open.values()), key=lambda s: s.since)


class _Collector:
    """The scan's receipt handler: fills a ReportData."""

    def __init__(self) -> None:
        self.data = ReportData(stats=ReadStats())
        self.pending: dict[Key, list[tuple[float, dict[str, Any]]]] = defaultdict(list)
        self.lanes: dict[str, list[Event]] = {lane: [] for lane in LANES}
        self.latency: dict[str, list[float]] = {"ttft_s": [], "e2e_s": [], "queue_s": []}
        self.series: dict[Key, dict[str, list[Point]]] = defaultdict(lambda: defaultdict(list))
        self.local: dict[Key, dict[str, list[Point]]] = defaultdict(lambda: defaultdict(list))
        self.ranks: dict[str, set[int]] = defaultdict(set)  # per boot: ranks seen
        self.declared: dict[str, int] = {}  # per boot: the ranks its boot.start says
        self.stalls = _Stalls()

    def __call__(self, rec: dict[str, Any]) -> None:
        t = _ts(rec)
        if t is None:
            return
        d, event, key = self.data, rec["event"], (rec["boot"], rec["rank"])
        d.t0 = t if d.t0 is None else min(d.t0, t)
        self.ranks[key[0]].add(key[1])
        for series, point, local in points(rec, t):
            (self.local if local else self.series)[key][series].append(point)
        if event == schema.ITERATION:
            self.pending[key].append((t, rec))  # the pool's size may come later in the file
        elif event == schema.BOOT_POOL_SIZED:
            cap = pool_capacity(rec)
            if cap is not None:
                d.capacity[key] = cap
        elif event == schema.REQUEST_FINISH:
            for name, values in self.latency.items():
                v = rec.get(name)
                if isinstance(v, int | float) and math.isfinite(v):
                    values.append(float(v))
        elif event == schema.SCHEDULER_STALL:
            self.stalls.stall(key, t, rec)
        elif event == schema.SCHEDULER_RESUME:
            self.stalls.resume(key, t, rec)
        elif event == schema.BOOT_START:
            said = declared_ranks(rec.get("config"))
            if said is not None:
                self.declared[key[0]] = max(self.declared.get(key[0], 0), said[0])
        elif event == schema.GROUP_FLOOR:
            floor = rec["floor"] if isinstance(rec["floor"], int | float) else None
            d.floors.setdefault(rec["rank"], []).append((t, floor, _num(rec, "local")))
        if event in _MARKERS:
            d.markers.append(Event(t, event, rec["rank"], f"{event} {rec['boot']}"))
        lane = _LANE_OF.get(event)
        if lane is not None:
            self._event(lane, t, rec)

    def _event(self, lane: str, t: float, rec: dict[str, Any]) -> None:
        events = self.lanes[lane]
        if len(events) >= MAX_EVENTS_PER_LANE:
            self.data.left_out[lane] = self.data.left_out.get(lane, 0) + 1
            return
        rid = f"rid={rec['rid']} " if "rid" in rec else ""
        events.append(Event(t, rec["event"], rec["rank"], f"{rec['event']}: {rid}{detail(rec)}"))

    def finish(self, stats: ReadStats) -> ReportData:
        d = self.data
        d.stats = stats
        for key, recs in self.pending.items():
            recs.sort(key=lambda tr: tr[0])
            d.pool[key] = [pool_sample(r, t, d.capacity.get(key)) for t, r in recs]
        self._series()
        d.stalls = self.stalls.all()
        d.lanes = {lane: sorted(ev, key=lambda e: e.t) for lane, ev in self.lanes.items()}
        d.latency = self.latency
        d.markers.sort(key=lambda e: e.t)
        for series in d.floors.values():
            series.sort(key=lambda x: x[0])
        return d

    def _series(self) -> None:
        """Every series in time order; the rank-local numbers only in boots of one rank."""
        for key, by_series in self.local.items():
            boot = key[0]
            if len(self.ranks[boot]) <= 1 and self.declared.get(boot, 1) <= 1:
                for name, pts in by_series.items():
                    self.series[key][name].extend(pts)
        self.data.series = {
            key: {name: sorted(pts, key=lambda p: p.t) for name, pts in by_series.items()}
            for key, by_series in self.series.items()
        }


def collect(logs: list[str | Path]) -> ReportData:
    """Read ``logs`` once into what the report draws; raises UnreadableLog like every reader."""
    c = _Collector()
    return c.finish(scan(logs, c))
