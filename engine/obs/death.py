"""The boot log's last receipt when the scheduler process dies.

A scheduler process killed from outside (the OOM killer, SIGKILL) writes nothing more, so its
boot log would end mid-work and read as a cut log. The frontend, which outlives it, writes the
``boot.stop`` itself (reason ``scheduler_died``), continuing the dead process's boot, rank and
``seq`` so the auditor reads one unbroken log that ends in a crash. Never raises: a death notice
that cannot be written is said on stderr, not raised into the exit path.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from engine.obs import schema
from engine.obs.receipts import Receipts

TAIL_BYTES = 1 << 16  # the last receipt is in the file's last 64 KiB (receipts are small)


def last_receipt(path: Path) -> dict[str, Any] | None:
    """The last whole receipt line of the boot log, or None when there is none."""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
        lines = f.read().splitlines()
    for line in reversed(lines):
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a line the dead process left half-written, or plain text
        if isinstance(rec, dict) and all(isinstance(rec.get(k), int) for k in ("seq", "rank")):
            return rec
    return None


def write_death(path: str | Path | None, reason: str, in_flight: int) -> bool:
    """Append ``boot.stop`` after the last receipt of the boot log at ``path``. False (and a
    line on stderr) when there is no log or no receipt in it to continue."""
    if path is None:
        return False
    try:
        p = Path(path)
        last = last_receipt(p)
        if last is None:
            print(f"attest: no receipt in {p} to continue; boot.stop not written", file=sys.stderr)
            return False
        with p.open("rb+") as f:  # a line cut by the kill ends here, not inside our receipt
            if f.seek(0, 2) and (f.seek(-1, 2), f.read(1))[1] != b"\n":
                f.write(b"\n")
        receipts = Receipts(p, boot=str(last.get("boot")), rank=last["rank"])
        receipts.seq = last["seq"]
        receipts.iter = last.get("iter", 0) if isinstance(last.get("iter"), int) else 0
        receipts.emit(schema.BOOT_STOP, reason=reason, in_flight=in_flight)
        receipts.close()
        return receipts.failures == 0
    except Exception as e:  # the exit path goes on: the operator still sees the death on stderr
        print(f"attest: could not write boot.stop ({type(e).__name__}: {e})", file=sys.stderr)
        return False
