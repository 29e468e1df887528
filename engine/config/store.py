"""The durable KV store's knobs (``engine/tiers/kv_store.py``): EngineConfig's ``store`` section."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.rules import _knob, _Section, int_or_none, need

STORE_WRITES = ("back", "second_hit")  # when a cached prefix's pages are written


@dataclass(frozen=True, slots=True)
class StoreSection(_Section):
    """Where the store lives, how much it may hold, what checkpoints may pin, when it writes."""

    kv_store_dir: str | None = _knob(
        None,
        "Durable KV store below the host tier: cached prefix pages are written here as they "
        "leave memory and loaded back on a prefix hit, across restarts. Default: off.",
    )
    kv_store_bytes: int | None = _knob(
        None,
        "The store's cap in allocated bytes on disk. Default: a quarter of the free space of "
        "its filesystem, at most 16 GiB.",
    )
    kv_store_pin_bytes: int | None = _knob(
        None, "Bytes conversation checkpoints may pin in the store. Default: half the cap."
    )

    # second_hit by measurement: across a crash it kept more of five agent lanes than back
    # (bench/agents.py --crash; BENCHMARKS.md, 2026-12-03), and it cost no TTFT there
    kv_store_write: str = _knob(
        "second_hit",
        "When cached prefix pages are written to the store: second_hit (as they leave memory, "
        "at a clean stop, and when a prefix is first reused, so it survives a crash) or back "
        "(only the first two).",
    )

    def validate(self) -> None:
        d = self.kv_store_dir
        need(d is None or (isinstance(d, str) and d != ""), self, "kv_store_dir", "a path or None")
        need(int_or_none(self.kv_store_bytes, 1), self, "kv_store_bytes", "None or an integer >= 1")
        need(
            int_or_none(self.kv_store_pin_bytes, 0),
            self,
            "kv_store_pin_bytes",
            "None or an integer >= 0",
        )
        need(
            self.kv_store_write in STORE_WRITES,
            self,
            "kv_store_write",
            " or ".join(STORE_WRITES),
        )
