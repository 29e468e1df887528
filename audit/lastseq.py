"""``LastSeq``: per (boot, rank), the highest ``seq`` of each key among the records one selector
picks, the key read from one field as the ``every`` claims read it (a scalar, or each element of
a list; None, objects and nested lists name no key).

Claims that ask for the same selector and key field share one (``Bus.last_seq``): a request's
ending is marked once however many claims wait for it, and held once. The highest seq, not the
last one read, so no answer depends on the order in which lines were read.
"""

from __future__ import annotations

from typing import Any

from audit.foreign import TEXT_BOOT


class LastSeq:
    __slots__ = ("field", "tables", "where", "_last")

    def __init__(self, field: str) -> None:
        self.field = field
        self.tables: dict[tuple[str, int], dict[Any, int]] = {}  # (boot, rank) -> key -> seq
        self.where: dict[Any, str] = {}  # a text event's key -> the line of its highest seq
        self._last: tuple[Any, Any, dict[Any, int]] = (None, None, {})  # boot, rank, its table

    def mark(self, rec: dict[str, Any]) -> None:
        keys = rec.get(self.field)
        if keys is None or type(keys) is dict:
            return
        boot, rank, table = self._last
        if rec["rank"] != rank or rec["boot"] != boot:  # lines of one rank come in runs
            boot, rank = rec["boot"], rec["rank"]
            table = self.tables.get((boot, rank))
            if table is None:
                table = self.tables[(boot, rank)] = {}
            self._last = boot, rank, table
        seq = rec["seq"]
        if type(keys) is list:
            for k in keys:
                if k is not None and not isinstance(k, list | dict) and table.get(k, 0) < seq:
                    table[k] = seq
                    if boot == TEXT_BOOT:
                        self.where[k] = rec.get("where", "?")
        elif table.get(keys, 0) < seq:
            table[keys] = seq
            if boot == TEXT_BOOT:
                self.where[keys] = rec.get("where", "?")


def highest(tables: list[dict[Any, int]]) -> dict[Any, int]:
    """Each key's highest seq over several selectors' tables of one (boot, rank)."""
    if len(tables) == 1:
        return tables[0]
    out: dict[Any, int] = {}
    for t in tables:
        for k, seq in t.items():
            if out.get(k, 0) < seq:
                out[k] = seq
    return out
