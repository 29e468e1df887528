"""Reading one log in several processes at once, each for its own share of the windows.

The reader's pass and the claims' callbacks each take about half of a verdict's time, and the
windows (specs) do not share what they decide: each of ``jobs`` processes reads the log for its
share of them (``share_out``: by what each costs, as ``audit.verdict`` times it on the log's
head), and the shares' verdicts are joined in the specs' order. The first share reads every
line and keeps the reading numbers (seq runs, counts, what was malformed); it hands them to the
others (``Handoff``), which pass over the lines of kinds their windows do not read, unparsed
(``audit.reader.scan``'s ``skip``), so a window that needs every line (a wedge, text lines)
stays with the first. Sending a parsed line costs what parsing it does, so none is sent.

Processes are forked (the specs, holding compiled checks, are not sent anywhere) and only where
that is safe: one thread running, a POSIX system. What a share hands back is pickled through a
pipe; an exception in a share is raised again in the caller.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Sequence
from functools import partial
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


def share_out(
    costs: Sequence[float],
    n: int,
    *,
    read: float = 0.0,
    kinds: Sequence[frozenset[str]] | None = None,
    fraction: Callable[[frozenset[str]], float] | None = None,
    movable: Sequence[bool] | None = None,
) -> list[list[int]]:
    """Indices into at most ``min(n, len(costs))`` shares, each in index order, with costs as
    even as putting each, dearest first, into the share it makes cheapest makes them. The first
    share reads the whole log (``read``: what that costs); with ``fraction``, another share
    reads only the part of it its specs' ``kinds`` are (``fraction(kinds)`` of ``read``), and a
    spec not ``movable`` (one that needs every line) stays in the first. Without them every
    share reads alike, so ``read`` drops out; an empty share other than the first is dropped."""
    m = min(n, len(costs))
    shares: list[list[int]] = [[] for _ in range(m)]
    held: list[frozenset[str]] = [frozenset()] * m
    load = [0.0] * m

    def after(j: int, i: int) -> float:
        ks = held[j] | (kinds[i] if kinds is not None else frozenset())
        r = read if j == 0 or fraction is None else read * fraction(ks)
        return r + load[j] + costs[i]

    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        options = range(m) if movable is None or movable[i] else range(1)
        j = min(options, key=lambda j: (after(j, i), len(shares[j]), j))
        shares[j].append(i)
        load[j] += costs[i]
        if kinds is not None:
            held[j] |= kinds[i]
    return [sorted(shares[0]), *(sorted(x) for x in shares[1:] if x)]


class Handoff:
    """What the first share's reading hands the other shares (pickled through a pipe each):
    the reading numbers of the logs, which a share that passed over lines cannot count. Made
    before the fork; ``run`` closes the ends each process does not use."""

    def __init__(self, others: int) -> None:
        self.pipes = [os.pipe() for _ in range(others)]

    def in_child(self, k: int) -> None:
        for j, (r, w) in enumerate(self.pipes):
            os.close(w)
            if j != k:
                os.close(r)
        self.pipes = [self.pipes[k]]

    def in_parent(self) -> None:
        for r, _ in self.pipes:
            os.close(r)

    def send(self, value: Any) -> None:
        """To every other share, once (the first share, after its reading)."""
        data = pickle.dumps(value)
        for _, w in self.pipes:
            try:
                with os.fdopen(w, "wb") as fh:
                    fh.write(data)
            except BrokenPipeError:  # that share ended already: its own failure says why
                pass
        self.pipes = []

    def close(self) -> None:
        """Nothing sent (the first share failed): the others read an end and fail too."""
        for _, w in self.pipes:
            os.close(w)
        self.pipes = []

    def receive(self) -> Any:
        """In another share: what the first sent (waiting for it)."""
        ((r, _),) = self.pipes
        with os.fdopen(r, "rb") as fh:
            data = fh.read()
        if not data:
            raise RuntimeError("the first reading ended without its reading numbers")
        return pickle.loads(data)


def run(fns: Sequence[Callable[[], T]], handoff: Handoff | None = None) -> list[T]:
    """Each of ``fns`` called in its own process (the first in this one); their results, in
    order. The first exception of any is raised here. With ``handoff``, the first hands the
    others what they wait for through it."""
    children: list[tuple[int, int]] = []
    try:
        for k, fn in enumerate(fns[1:]):
            children.append(_fork(fn, None if handoff is None else partial(handoff.in_child, k)))
        if handoff is not None:
            handoff.in_parent()
        first = fns[0]()
    finally:
        if handoff is not None:
            handoff.close()
        got = [_collect(pid, fd) for pid, fd in children]
    for ok, value in got:
        if not ok:
            raise value
    return [first, *(value for _, value in got)]


def _fork(fn: Callable[[], Any], setup: Callable[[], None] | None) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        return pid, r
    os.close(r)  # the child: its share, pickled into the pipe, then gone without cleanup
    try:
        try:
            if setup is not None:
                setup()
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
