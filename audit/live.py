"""A live window: the log of a server still running, judged as a window that ends at its last line
(``audit verdict --live``).

Such a log has no end of its run (no ``boot.stop``, no server's shutdown line), so a claim about
how the run ended could never be decided on it. In a live window the window's end stands for the
run's end, and only there: a claim about the end of the run is decided as of the last line
(``Context.live``: a boot with nothing against it so far ended in order; a last value that holds
there is final), while what is still open there (a request in flight, a last value that does not
hold yet) stays UNDECIDED, never FAIL: the run goes on after the window. A stop inside the window
is read as ever. ``WindowEnd`` records where the window ends, for the report.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from audit.checker import Bus

OnText = Callable[[str, str, str], None]  # (source, line, where), as the reader calls it


class WindowEnd:
    """Where a live window ends: each (boot, rank)'s last receipt (highest seq: its iter and ts)
    and the last text line read (file and line)."""

    def __init__(self, bus: Bus) -> None:
        self.receipts: dict[tuple[str, int], dict[str, Any]] = {}
        self.text_line: str | None = None
        bus.any.append(self._receipt)  # before the reader's routes are made

    def _receipt(self, rec: dict[str, Any]) -> None:
        at = (rec["boot"], rec["rank"])
        held = self.receipts.get(at)
        if held is None or rec["seq"] > held["seq"]:
            self.receipts[at] = {"seq": rec["seq"], "iter": rec.get("iter"), "ts": rec.get("ts")}

    def watch(self, on_text: OnText) -> OnText:
        """``on_text``, noting each text line's place on the way."""

        def fn(source: str, line: str, where: str) -> None:
            self.text_line = where
            on_text(source, line, where)

        return fn

    def as_dict(self, lines: int) -> dict[str, Any]:
        """The report's ``window_end``; ``lines``: the lines read in all."""
        return {
            "receipts": [
                {"boot": boot, "rank": rank, **end}
                for (boot, rank), end in sorted(self.receipts.items(), key=lambda kv: repr(kv[0]))
            ],
            "text_line": self.text_line,
            "lines": lines,
        }

    def describe(self) -> str:
        """Where the window ends, for a report's header."""
        ends = [
            f"boot {boot} rank {rank}: seq {e['seq']}, iter {e['iter']}{_when(e['ts'])}"
            for (boot, rank), e in sorted(self.receipts.items(), key=lambda kv: repr(kv[0]))
        ]
        if self.text_line is not None:
            ends.append(f"text at {self.text_line}")
        return "; ".join(ends) or "nothing was read"


def _when(ts: Any) -> str:
    """A receipt's ``ts`` as a UTC time, where it is one."""
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return ""
    try:
        at = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return ""
    return ", " + at.strftime("%Y-%m-%dT%H:%M:%SZ")
