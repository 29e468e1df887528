"""Reading one log in several processes at once, each for its own share of the windows.

The reader's pass is half of a verdict's time and the claims' callbacks the other half; the
windows (specs) do not share what they decide, so each of ``jobs`` processes reads the whole log
for a contiguous share of them and the shares' verdicts are joined in the specs' order. Each
process still parses every line (a line's parse costs what sending it would), so two cores save
about a fifth; what is held is each process's own.

Processes are forked (the specs, holding compiled checks, are not sent anywhere) and only where
that is safe: one thread running, a POSIX system. What a share hands back is pickled through a
pipe; an exception in a share is raised again in the caller.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
MIN_BYTES = 64 << 20  # a smaller log is read in one process: a fork would cost what it saves


def jobs_for(asked: int, logs: Sequence[str | Path], shares: int) -> int:
    """How many processes to read ``logs`` in: ``asked`` (0: the usable cores, where the logs
    are at least ``MIN_BYTES``), no more than ``shares``; 1 where forking is not safe."""
    if shares < 2 or asked == 1 or not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    if asked == 0:
        if sum(Path(p).stat().st_size for p in logs) < MIN_BYTES:
            return 1
        asked = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    return max(1, min(asked, shares))


def split(weights: Sequence[int], n: int) -> list[range]:
    """``n`` contiguous, non-empty ranges of indices (``n`` at most the number of weights), cut
    where the weights summed so far pass each n-th of the total."""
    total, out, start, acc = sum(weights), [], 0, 0
    for i, w in enumerate(weights):
        acc += w
        cuts, after = n - 1 - len(out), len(weights) - i - 1  # cuts to make, weights left
        if cuts and after >= cuts and (acc >= total * (len(out) + 1) / n or after == cuts):
            out.append(range(start, i + 1))
            start = i + 1
    out.append(range(start, len(weights)))
    return out


def run(fns: Sequence[Callable[[], T]]) -> list[T]:
    """Each of ``fns`` called in its own process (the first in this one); their results, in
    order. The first exception of any is raised here."""
    children: list[tuple[int, int]] = []
    try:
        for fn in fns[1:]:
            children.append(_fork(fn))
        first = fns[0]()
    finally:
        got = [_collect(pid, fd) for pid, fd in children]
    for ok, value in got:
        if not ok:
            raise value
    return [first, *(value for _, value in got)]


def _fork(fn: Callable[[], Any]) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        return pid, r
    os.close(r)  # the child: its share, pickled into the pipe, then gone without cleanup
    try:
        try:
            data = pickle.dumps((True, fn()))
        except BaseException as e:  # noqa: BLE001 (handed to the parent to raise)
            try:
                data = pickle.dumps((False, e))
            except Exception:  # noqa: BLE001 (an exception that does not pickle)
                data = pickle.dumps((False, RuntimeError(f"a reading process failed: {e!r}")))
        with os.fdopen(w, "wb") as fh:
            fh.write(data)
    finally:
        os._exit(0)


def _collect(pid: int, fd: int) -> tuple[bool, Any]:
    with os.fdopen(fd, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return False, RuntimeError(f"a reading process ended without its verdicts ({status})")
    return pickle.loads(data)
