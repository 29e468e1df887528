"""Small hand-made boot logs for the auditor's tests: receipts with the common fields filled in
(seq counted per boot and rank, as the engine does), text lines, and lost lines on purpose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


class LogText:
    def __init__(self, boot: str = "b-00000001") -> None:
        self.boot = boot
        self.lines: list[str] = []
        self.seq: dict[tuple[str, int], int] = {}
        self.ts = 1000.0
        self.iter = 0

    def r(self, event: str, rank: int = 0, *, lose: bool = False, **fields: Any) -> LogText:
        """A receipt; ``lose=True`` uses its seq but leaves it out (a lost line)."""
        boot = fields.pop("boot", self.boot)
        key = (boot, rank)
        self.seq[key] = self.seq.get(key, 0) + 1
        self.ts = fields.pop("ts", self.ts + 0.01)
        rec = {
            "ts": self.ts,
            "event": event,
            "v": 1,
            "boot": boot,
            "rank": rank,
            "iter": fields.pop("iter", self.iter),
            "seq": self.seq[key],
            **fields,
        }
        if not lose:
            self.lines.append(orjson.dumps(rec).decode())
        return self

    def text(self, line: str) -> LogText:
        self.lines.append(line)
        return self

    def ready(self, rank: int = 0) -> LogText:
        self.r("boot.start", rank, config={})
        return self.r("boot.ready", rank, startup_s=0.1)

    def received(self, rid: str, rank: int = 0, **f: Any) -> LogText:
        return self.r("request.received", rank, rid=rid, prompt_tokens=5, max_new_tokens=3, **f)

    def finish(self, rid: str, rank: int = 0, **f: Any) -> LogText:
        return self.r("request.finish", rank, rid=rid, reason="length", tokens=3, **f)

    def park(self, rid: str, rank: int = 0, **f: Any) -> LogText:
        f = {"reason": "below_page", "need": 40, "fundable": 0, "page_size": 4, "remaining": 0} | f
        return self.r("admission.park", rank, rid=rid, **f)

    def stop(self, rank: int = 0) -> LogText:
        return self.r("boot.stop", rank, reason="test", in_flight=0)

    def __str__(self) -> str:
        return "\n".join(self.lines) + "\n"

    def write(self, path: Path) -> Path:
        path.write_text(str(self), encoding="utf-8")
        return path
