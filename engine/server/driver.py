"""EngineDriver: runs the scheduler loop on its own thread and hands results to asyncio.

The HTTP handlers never touch the scheduler: they submit and abort through a queue, and receive
their request's outputs on an asyncio queue, so a handler that fails cannot corrupt a step.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import traceback
from dataclasses import dataclass, field

from engine.core import EngineCore
from engine.sampling import SamplingParams
from engine.sched.scheduler import StepOutput


@dataclass(slots=True)
class Submission:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    cached: int = 0
    errors: list[str] = field(default_factory=list)


class EngineDriver:
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._inbox: queue.Queue[tuple[str, object]] = queue.Queue()
        self._subs: dict[str, Submission] = {}
        self._thread = threading.Thread(target=self._run, name="attest-scheduler", daemon=True)
        self._stop = threading.Event()
        self.dead: str | None = None  # why the loop died, if it did

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout)

    def submit(self, sub: Submission) -> None:
        if self.dead:
            raise RuntimeError(f"scheduler is not running: {self.dead}")
        self._inbox.put(("add", sub))

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid))

    def stats(self) -> dict[str, int]:
        s = self.core.scheduler
        alloc, cache = self.core.allocator, s.cache
        return {
            "running": len(s.running),
            "waiting": len(s.waiting),
            # held by requests (their private pages and the cached prefixes they lock)
            "kv_used": alloc.used_size() - cache.evictable_size(),
            "kv_cached": cache.total_size(),  # prefix cache, reusable
            "kv_evictable": cache.evictable_size(),
            "kv_free": alloc.available_size(),
            "kv_total": alloc.capacity,
        }

    def _deliver(self, sub: Submission, item: object) -> None:
        sub.loop.call_soon_threadsafe(sub.out.put_nowait, item)

    def _drain(self, block: bool) -> None:
        sched = self.core.scheduler
        while True:
            try:
                kind, arg = self._inbox.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            block = False
            if kind == "add":
                sub = arg
                try:
                    sched.add_request(sub.prompt_ids, sub.params, rid=sub.rid)
                    self._subs[sub.rid] = sub
                except ValueError as e:
                    self._deliver(sub, e)
            elif kind == "abort":
                if sched.abort(arg, reason="client_disconnect"):
                    sub = self._subs.pop(arg, None)
                    if sub is not None:
                        self._deliver(sub, StepOutput(arg, [], "", True, "abort"))

    def _run(self) -> None:
        sched = self.core.scheduler
        try:
            while not self._stop.is_set():
                self._drain(block=not sched.has_work())
                if not sched.has_work():
                    continue
                for out in sched.step():
                    sub = self._subs.get(out.rid)
                    if sub is None:
                        continue
                    self._deliver(sub, out)
                    if out.finished:
                        del self._subs[out.rid]
        except Exception as e:  # the loop is dead: every waiter must hear it, none may hang
            self.dead = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            for sub in self._subs.values():
                self._deliver(sub, RuntimeError(f"scheduler failed: {self.dead}"))
            self._subs.clear()
