"""EngineDriver: the scheduler in its own process, spoken to over a local pipe.

The frontend never touches the scheduler: it sends the small typed messages of
``engine.messages`` (add, abort, notice, stop) and receives each step's outputs, together with a
snapshot of the pool taken right after that step. Nothing here imports torch: the engine is built
in the scheduler process only.
A reader thread hands outputs to the asyncio queue of their request. If the scheduler process
dies, every waiting request hears it at once and the frontend reports it: nothing hangs.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.messages import (
    AbortRequest,
    AddRequest,
    Dead,
    EngineInfo,
    Notice,
    Outputs,
    PoolSnapshot,
    Ready,
    Rejected,
    Stop,
    Stopped,
    ToFrontend,
    ToScheduler,
)
from engine.sampling_params import SamplingParams
from engine.server.scheduler_proc import scheduler_main


@dataclass(slots=True)
class Submission:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue


class EngineDriver:
    """The frontend's handle on the scheduler process.

    ``on_dead`` is called once, from the reader thread, when the scheduler process dies or
    reports a fatal error: the server uses it to stop with a non-zero status."""

    def __init__(self, config: EngineConfig, on_dead: Callable[[str], None] | None = None) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=scheduler_main, args=(config, child), name="attest-scheduler", daemon=True
        )
        self._child = child
        self._send_lock = threading.Lock()
        self._subs: dict[str, Submission] = {}
        self._subs_lock = threading.Lock()
        self._snapshot = PoolSnapshot()
        self._stopped = threading.Event()
        self.dead: str | None = None
        self.in_flight_at_death = 0  # requests waiting on the scheduler process when it died
        self.stopping: str | None = None  # the reason, once an orderly stop has begun
        self.on_dead = on_dead
        self.info: EngineInfo | None = None  # set by start()
        self.tokenizer: Any = None
        self._reader = threading.Thread(target=self._read, name="attest-ipc-reader", daemon=True)

    def start(self, timeout: float = 600) -> None:
        """Start the scheduler process and wait until its engine is built."""
        self._proc.start()
        self._child.close()
        if not self._conn.poll(timeout):
            self._proc.terminate()
            raise RuntimeError(f"scheduler process did not become ready in {timeout:.0f} s")
        try:
            msg = self._conn.recv()
        except EOFError:  # it died while building the engine (killed, out of memory)
            self._proc.join(1)
            raise RuntimeError(
                f"scheduler process exited (code {self._proc.exitcode}) before it was ready"
            ) from None
        if not isinstance(msg, Ready):
            raise RuntimeError(msg.reason)  # Dead: why the engine could not start
        self.info, self.tokenizer, self._snapshot = msg.info, msg.tokenizer, msg.snapshot
        self._reader.start()

    @property
    def max_context(self) -> int:
        return self.info.context

    @property
    def vocab_size(self) -> int:
        return self.info.vocab

    def drain(self, reason: str) -> None:
        """Begin an orderly stop: refuse new work; the scheduler aborts what is in flight
        (each with a receipt), writes ``boot.stop`` and exits. Safe to call more than once."""
        with self._send_lock:  # one order with submit: no request can slip in after the stop
            if self.stopping is not None or self.dead:
                return
            self.stopping = reason
            try:
                self._conn.send(Stop(reason=reason))
            except (OSError, ValueError):
                pass  # the process is already gone; the reader reports it

    def stop(self, reason: str = "shutdown", timeout: float = 10.0) -> None:
        """Drain and wait for the scheduler process to exit (killing it only past ``timeout``)."""
        self.drain(reason)
        self._stopped.wait(timeout)
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)

    def _send(self, msg: ToScheduler) -> None:
        with self._send_lock:
            self._conn.send(msg)

    def submit(self, sub: Submission, trace_id: str | None = None) -> None:
        """``trace_id``: the W3C traceparent the request's scheduler spans go under (or None)."""
        with self._send_lock:
            if self.stopping:
                raise RuntimeError(f"server is shutting down ({self.stopping})")
            with self._subs_lock:  # one order with _fail_all: a dead driver takes no request
                if self.dead:
                    raise RuntimeError(f"scheduler is not running: {self.dead}")
                self._subs[sub.rid] = sub
            msg = AddRequest(
                rid=sub.rid, prompt_ids=sub.prompt_ids, params=sub.params, trace=trace_id
            )
            try:
                self._conn.send(msg)
            except (OSError, ValueError) as e:  # it died before the reader noticed
                with self._subs_lock:
                    self._subs.pop(sub.rid, None)
                raise RuntimeError(f"scheduler is not running: {e}") from e

    def notice(self, key: str, text: str, **fields: Any) -> None:
        """Say something once in the boot log (the scheduler process writes it). Never raises."""
        if not self.dead:
            try:
                self._send(Notice(key=key, text=text, fields=fields))
            except Exception:
                pass

    def abort(self, rid: str, reason: str = "client_disconnect") -> None:
        if not self.dead:
            try:
                self._send(AbortRequest(rid=rid, reason=reason))
            except Exception:
                pass

    def stats(self) -> PoolSnapshot:
        """The pool as of the latest step (frozen: the reader replaces it, never edits it)."""
        return self._snapshot

    def _deliver(self, items: list[tuple[str, object, bool]]) -> None:
        """Hand (rid, item, final) to their requests' queues: one lock and one wake-up of
        each event loop per message, not per request."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        with self._subs_lock:
            for rid, item, final in items:
                sub = self._subs.pop(rid, None) if final else self._subs.get(rid)
                if sub is not None:
                    by_loop.setdefault(sub.loop, []).append((sub.out, item))
        for loop, puts in by_loop.items():
            loop.call_soon_threadsafe(_put_all, puts)

    def _fail_all(self, message: str, dead: str | None = None) -> None:
        with self._subs_lock:
            if dead is not None:
                self.dead = dead
                self.in_flight_at_death = len(self._subs)
            rids = list(self._subs)
        self._deliver([(rid, RuntimeError(message), True) for rid in rids])

    def _read(self) -> None:
        try:
            while self._on(self._conn.recv()):
                pass
        except (EOFError, OSError, RuntimeError) as e:
            self._proc.join(1)
            code = self._proc.exitcode
            dead = (
                str(e) if isinstance(e, RuntimeError) else f"scheduler process exited (code {code})"
            )
            self._fail_all(f"scheduler failed: {dead}", dead=dead)
            self._stopped.set()
            if self.on_dead is not None:
                self.on_dead(self.dead)

    def _on(self, msg: ToFrontend) -> bool:
        """Act on one message from the scheduler process; False once it has stopped."""
        match msg:
            case Outputs(outputs=outs, snapshot=snap):
                self._snapshot = snap  # before the outputs: a finished request's memory is back
                self._deliver([(out.rid, out, out.finished) for out in outs])
            case Rejected(rid=rid, message=message):
                self._deliver([(rid, ValueError(message), True)])
            case Stopped(reason=reason):
                self._fail_all(f"server is shutting down ({reason})")
                self._stopped.set()
                return False
            case Dead(reason=reason):
                raise RuntimeError(reason)
        return True


def _put_all(puts: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in puts:
        queue.put_nowait(item)
