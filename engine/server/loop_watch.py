"""The HTTP process's event loop watching itself: a loop that stops turning stops every client at
once (``/health`` included), so it must be on the record while it stands, not only after.

A task on the loop marks each turn (a sleep of ``interval_s``); a thread of its own notices a
turn that is later than its sleep by more than ``limit_s`` while it is late, and writes
``frontend.stall`` then, with the wall time of the last turn and the stack of the loop's thread
(where it stands: a check that grew with a request, a blocking call). When the loop turns again
the task writes ``frontend.resume`` with how long it stood (and the stall too, without a stack,
where it was too short for the thread to see). ``/health`` and ``/metrics`` carry the counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator
from typing import Any

from engine.observability import schema
from engine.server.frontdoor import Recorder

INTERVAL_S = 0.1
STACK_CHARS = 4000  # the loop thread's stack in a stall receipt: its innermost frames


class LoopWatch:
    """Counts and records the stalls of the loop it runs on (``run``, a task of that loop)."""

    def __init__(self, limit_s: float, recorder: Recorder, interval_s: float = INTERVAL_S) -> None:
        self.limit_s = limit_s
        self.recorder = recorder
        self.interval_s = interval_s
        self.stalls = 0  # stalls past limit_s since boot
        self.lag_s = 0.0  # how late the last turn came
        self.worst_s = 0.0  # the latest turn since boot
        self._beat = time.monotonic()
        self._beat_wall = time.time()
        self._stalled = False
        self._loop_thread: int | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()

    async def run(self) -> None:
        """Mark the loop's turns until cancelled; the watching thread runs meanwhile."""
        self._loop_thread = threading.get_ident()
        self._beat, self._beat_wall = time.monotonic(), time.time()
        watcher = threading.Thread(target=self._watch, name="attest-loop-watch", daemon=True)
        watcher.start()
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                self.turn()
        finally:
            self._done.set()

    @contextlib.asynccontextmanager
    async def lifespan(self, _: object) -> AsyncIterator[None]:
        """An app's lifespan that watches its loop while it serves."""
        task = asyncio.ensure_future(self.run())
        yield
        task.cancel()

    def turn(self) -> None:
        """One turn of the loop: how late it came (beyond its sleep), and the end of a stall
        it ends. A stall too short for the thread to see while it stood is written now."""
        now = time.monotonic()
        with self._lock:
            self.lag_s = max(0.0, now - self._beat - self.interval_s)
            self.worst_s = max(self.worst_s, self.lag_s)
            seen, self._stalled = self._stalled, False
            unseen = not seen and self.lag_s > self.limit_s
            self.stalls += unseen
            since = self._beat_wall
            self._beat, self._beat_wall = now, time.time()
        if unseen:
            self._write_stall(since, "")
        if seen or unseen:
            self.recorder.record(schema.FRONTEND_RESUME, stalled_s=round(self.lag_s, 3))

    def _write_stall(self, since: float, stack: str) -> None:
        self.recorder.record(
            schema.FRONTEND_STALL, since=round(since, 6), limit_s=self.limit_s, stack=stack
        )

    def _watch(self) -> None:
        while not self._done.wait(self.interval_s / 2):
            self.check()

    def check(self) -> bool:
        """Whether the loop stands past its limit now (later than its sleep by more than
        ``limit_s``); the first time it does (per stall), the ``frontend.stall`` receipt, with
        the stack of the loop's thread."""
        with self._lock:
            late = time.monotonic() - self._beat - self.interval_s
            if self._stalled or late <= self.limit_s:
                return self._stalled
            self._stalled = True
            self.stalls += 1
            since = self._beat_wall
        self._write_stall(since, self._stack())
        return True

    def _stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread or -1)
        if frame is None:
            return ""
        return "".join(traceback.format_stack(frame))[-STACK_CHARS:]

    def health(self) -> dict[str, Any]:
        """What ``/health`` says of the loop."""
        return {
            "loop_lag_s": round(self.lag_s, 3),
            "loop_stalls": self.stalls,
            "loop_worst_lag_s": round(self.worst_s, 3),
            "loop_stall_limit_s": self.limit_s,
        }
