"""Reading one log in several processes at once, each for its own share of the windows.

The reader's pass is half of a verdict's time and the claims' callbacks the other half, and the
windows (specs) do not share what they decide: each of ``jobs`` processes reads the whole log
for its share of them (``share_out``: by what each costs, as ``audit.verdict`` times it on the
log's head), and the shares' verdicts are joined in the specs' order. Each process still parses
every line (sending a parsed line costs what parsing it does), so two cores save about a tenth
to a fifth of the time and spend twice the CPU.

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


def share_out(costs: Sequence[float], n: int) -> list[list[int]]:
    """Indices into ``min(n, len(costs))`` non-empty shares, each in index order, with costs as
    even as putting each, dearest first, into the cheapest share so far makes them (an empty
    share is the cheapest)."""
    shares: list[list[int]] = [[] for _ in range(min(n, len(costs)))]
    load = [0.0] * len(shares)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        j = min(range(len(shares)), key=lambda j: (load[j], len(shares[j]), j))
        shares[j].append(i)
        load[j] += costs[i]
    return [sorted(x) for x in shares]


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
