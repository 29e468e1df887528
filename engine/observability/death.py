"""The boot log's last receipt when the scheduler process dies, or a boot fails before serving.

A scheduler process killed from outside (the OOM killer, SIGKILL) writes nothing more, so its
boot log would end mid-work and read as a cut log. The frontend, which outlives it, writes the
``boot.stop`` itself (reason ``scheduler_died``, with the signal or exit code), continuing the
dead process's boot, rank and ``seq`` so the auditor reads one unbroken log that ends in a crash.
Before it, each request that was in flight gets its ``request.abort`` (same reason), unless the
dead process wrote its ending already. Never raises: a death notice that cannot be written is
said on stderr, not raised into the exit path.

A boot that fails before it serves (its engine could not be built) would leave a log that only
began. The process about to exit writes ``boot.stop`` ``boot_failed`` with its exit code and
message, ending the boot that the failed engine began: the one whose ``boot.start`` names that
engine's pid (the file may hold earlier boots). A boot stopped by a signal while its engine was
being built is ended the same way, in order (``write_boot_stopped``).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from engine.observability import schema
from engine.observability.clip import clip_words
from engine.observability.receipts import Receipts

TAIL_BYTES = 1 << 16  # the last receipt is in the file's last 64 KiB (receipts are small)
ERROR_CHARS = 500  # a message in a receipt: about this long at most, cut between words


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
        # its output was lost with the process, but the ending is written: no second ending
        ended = {r.get("rid") for r in tail if r.get("event") in _ENDINGS}
        lost = [rid for rid in rids if rid not in ended]
        receipts = _after(p, tail[-1])
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


def _after(p: Path, last: dict[str, Any]) -> Receipts:
    """Receipts that continue ``last``'s boot, rank, seq and iter in the log at ``p``, on a line
    of their own (a line cut by a kill ends before them, not inside them)."""
    with p.open("rb+") as f:
        if f.seek(0, 2) and (f.seek(-1, 2), f.read(1))[1] != b"\n":
            f.write(b"\n")
    it = last.get("iter", 0) if isinstance(last.get("iter"), int) else 0
    return Receipts(p, boot=str(last.get("boot")), rank=last["rank"], after=(last["seq"], it))


def write_boot_failed(path: str | Path | None, pid: int | None, exit_code: int, error: str) -> bool:
    """End the boot that process ``pid`` began in the log at ``path`` with ``boot.stop``
    ``boot_failed``, ``exit_code`` (what the failed boot's process exits with) and ``error``
    (its message). False, writing nothing, where no ``boot.start`` of that process is in the
    log's tail (it failed before it wrote one: nothing began) or that boot has ended already."""
    return _end_boot(
        path, pid, schema.BOOT_FAILED, exit_code=exit_code, error=clip_words(error, ERROR_CHARS)
    )


def write_boot_stopped(path: str | Path | None, pid: int | None, reason: str) -> bool:
    """End the boot that process ``pid`` began with an orderly ``boot.stop`` (``reason``, one of
    ``schema.ORDERLY_STOPS``): a stop asked while its engine was being built, which had nothing
    in flight yet. False, writing nothing, as ``write_boot_failed``."""
    return _end_boot(path, pid, reason)


def _end_boot(path: str | Path | None, pid: int | None, reason: str, **fields: Any) -> bool:
    if path is None or pid is None:
        return False
    p = Path(path)
    try:
        tail = tail_receipts(p) if p.is_file() else []
        starts = [r for r in tail if r.get("event") == schema.BOOT_START and r.get("pid") == pid]
        if not starts:
            return False
        at = (starts[-1].get("boot"), starts[-1]["rank"])
        own = [r for r in tail if (r.get("boot"), r["rank"]) == at]
        if any(r.get("event") == schema.BOOT_STOP for r in own):
            return False
        receipts = _after(p, max(own, key=lambda r: r["seq"]))
        receipts.emit(schema.BOOT_STOP, reason=reason, in_flight=0, **fields)
        receipts.close()
        return receipts.failures == 0
    except Exception as e:  # the exit path goes on: the operator still sees the error on stderr
        print(f"attest: could not write boot.stop ({type(e).__name__}: {e})", file=sys.stderr)
        return False


def how_it_ended(code: int | None) -> str:
    """A process's end in words, from its multiprocessing exit code (-N: killed by signal N)."""
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited (code {code})"
