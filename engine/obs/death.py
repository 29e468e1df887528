"""The boot log's last receipt when the scheduler process dies.

A scheduler process killed from outside (the OOM killer, SIGKILL) writes nothing more, so its
boot log would end mid-work and read as a cut log. The frontend, which outlives it, writes the
``boot.stop`` itself (reason ``scheduler_died``, with the signal or exit code), continuing the
dead process's boot, rank and ``seq`` so the auditor reads one unbroken log that ends in a crash.
Before it, each request that was in flight gets its ``request.abort`` (same reason), unless the
dead process wrote its ending already. Never raises: a death notice that cannot be written is
said on stderr, not raised into the exit path.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from engine.obs import schema
from engine.obs.receipts import Receipts

TAIL_BYTES = 1 << 16  # the last receipt is in the file's last 64 KiB (receipts are small)


_ENDINGS = (schema.REQUEST_FINISH, schema.REQUEST_ABORT)


def tail_receipts(path: Path) -> list[dict[str, Any]]:
    """The whole receipt lines in the boot log's last ``TAIL_BYTES``, in order."""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
        lines = f.read().splitlines()
    out = []
    for line in lines:
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a line the dead process left half-written, or plain text
        if isinstance(rec, dict) and all(isinstance(rec.get(k), int) for k in ("seq", "rank")):
            out.append(rec)
    return out


def exit_fields(exit_code: int | None) -> dict[str, Any]:
    """How a process ended, as receipt fields: its exit code, and the signal that killed it."""
    if exit_code is None:
        return {}
    if exit_code < 0:
        try:
            return {"signal": signal.Signals(-exit_code).name, "exit_code": exit_code}
        except ValueError:
            return {"signal": f"signal {-exit_code}", "exit_code": exit_code}
    return {"exit_code": exit_code}


def write_death(
    path: str | Path | None, reason: str, rids: Sequence[str], exit_code: int | None = None
) -> bool:
    """Append an abort for each request of ``rids`` (those in flight when the scheduler process
    died) not already ended in the log's tail, then ``boot.stop`` with the exit code and signal
    (``exit_code`` as multiprocessing reports it: -N for signal N). False (and a line on stderr)
    when there is no log or no receipt in it to continue."""
    if path is None:
        return False
    try:
        p = Path(path)
        tail = tail_receipts(p)
        if not tail:
            print(f"attest: no receipt in {p} to continue; boot.stop not written", file=sys.stderr)
            return False
        last = tail[-1]
        # its output was lost with the process, but the ending is written: no second ending
        ended = {r.get("rid") for r in tail if r.get("event") in _ENDINGS}
        lost = [rid for rid in rids if rid not in ended]
        with p.open("rb+") as f:  # a line cut by the kill ends here, not inside our receipt
            if f.seek(0, 2) and (f.seek(-1, 2), f.read(1))[1] != b"\n":
                f.write(b"\n")
        it = last.get("iter", 0) if isinstance(last.get("iter"), int) else 0
        receipts = Receipts(
            p, boot=str(last.get("boot")), rank=last["rank"], after=(last["seq"], it)
        )
        for rid in lost:
            receipts.emit(schema.REQUEST_ABORT, rid=rid, reason=reason)
        receipts.emit(
            schema.BOOT_STOP, reason=reason, in_flight=len(lost), **exit_fields(exit_code)
        )
        receipts.close()
        return receipts.failures == 0
    except Exception as e:  # the exit path goes on: the operator still sees the death on stderr
        print(f"attest: could not write boot.stop ({type(e).__name__}: {e})", file=sys.stderr)
        return False
