"""Looking at a log without a spec: one request's receipts as a timeline, and a summary
(receipts per kind and rank, pool usage over time as a sparkline)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.reader import scan
from audit.readstats import ReadStats
from engine.observability import schema

BARS = "▁▂▃▄▅▆▇█"
_SKIP = {"ts", "event", "v", "boot", "rank", "iter", "seq", "rid", "rids", "candidates"}


def _mentions(rec: dict[str, Any], rid: str) -> bool:
    if rec.get("rid") == rid:
        return True
    rids = rec.get("rids")
    return isinstance(rids, list) and rid in rids


def timeline(logs: list[str | Path], rid: str) -> tuple[list[dict[str, Any]], ReadStats]:
    """Every receipt that names ``rid`` (as ``rid`` or in ``rids``), by (boot, rank, seq)."""
    found: list[dict[str, Any]] = []

    def on_receipt(rec: dict[str, Any]) -> None:
        if _mentions(rec, rid):
            found.append(rec)

    stats = scan(logs, on_receipt)
    found.sort(key=lambda r: (r["boot"], r["rank"], r["seq"]))
    return found, stats


def detail(rec: dict[str, Any]) -> str:
    """The fields that make a receipt's decision, one line."""
    parts = [f"{k}={v}" for k, v in rec.items() if k not in _SKIP]
    if rec["event"] == schema.RETRACT:
        parts.insert(0, f"rids={rec.get('rids')}")
    return " ".join(parts)


def sparkline(values: list[float], width: int = 40) -> str:
    """``values`` (0..1) squeezed into ``width`` buckets (each bucket's maximum)."""
    if not values:
        return ""
    n = min(width, len(values))
    out = []
    for i in range(n):
        chunk = values[i * len(values) // n : (i + 1) * len(values) // n] or [values[-1]]
        v = max(0.0, min(1.0, max(chunk)))
        out.append(BARS[min(len(BARS) - 1, int(v * len(BARS)))])
    return "".join(out)


@dataclass(slots=True)
class Summary:
    stats: ReadStats
    usage: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # rank -> (ts, use)

    def kinds_by_rank(self) -> dict[str, dict[int, int]]:
        table: dict[str, dict[int, int]] = defaultdict(dict)
        for (rank, kind), n in self.stats.kinds.items():
            table[kind][rank] = n
        return dict(sorted(table.items()))


def summarize(logs: list[str | Path]) -> Summary:
    usage: dict[int, list[tuple[float, float]]] = defaultdict(list)

    def on_receipt(rec: dict[str, Any]) -> None:
        if rec["event"] == schema.ITERATION:
            u, ts = rec.get("token_usage"), rec.get("ts")
            if isinstance(u, int | float) and isinstance(ts, int | float):
                usage[rec["rank"]].append((ts, float(u)))

    stats = scan(logs, on_receipt)
    for series in usage.values():
        series.sort()
    return Summary(stats, dict(usage))
