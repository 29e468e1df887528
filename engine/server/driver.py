"""EngineDriver: the scheduler in its own process, spoken to over a local pipe.

The frontend never touches the scheduler: it sends small typed messages (add, abort, stop) and
receives each step's outputs, together with a snapshot of the pool taken right after that step.
A reader thread hands outputs to the asyncio queue of their request. If the scheduler process
dies, every waiting request hears it at once and the frontend reports it: nothing hangs.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.sampling import SamplingParams
from engine.sched.request import State


@dataclass(slots=True)
class Submission:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue


def _stats(core: Any) -> dict[str, Any]:
    s = core.scheduler
    alloc, cache = core.allocator, s.cache
    parked = sum(1 for r in s.running if r.state is State.PARKED)
    return {
        "running": len(s.running) - parked,
        "parked": parked,
        "waiting": len(s.waiting),
        # held by requests (their private pages and the cached prefixes they lock)
        "kv_used": alloc.used_size() - cache.evictable_size(),
        "kv_cached": cache.total_size(),  # prefix cache, reusable
        "kv_evictable": cache.evictable_size(),
        "kv_free": alloc.available_size(),
        "kv_total": alloc.capacity,
        "receipts": dict(core.receipts.counts),  # decisions since boot, by kind
    }


def scheduler_main(config: EngineConfig, conn: Any) -> None:
    """The scheduler process: build the engine, then step while there is work."""
    # the frontend owns the terminal's signals; this process stops when told, over the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from engine.obs.tracing import setup_tracing
    from engine.sched.traces import RequestTraces

    sink: list[Any] = []  # the receipts, once the engine is built: where a dropped-span notice goes
    tracing = setup_tracing(
        config.otlp_endpoint,
        "scheduler",
        on_drop=lambda text: sink and sink[0].notice("spans_dropped", text, process="scheduler"),
    )
    try:
        from engine.core import EngineCore

        with tracing.span("boot", **{"attest.process": "scheduler"}) as span:
            core = EngineCore(config)
            d = core.describe()
            if span is not None:
                span.set_attributes({
                    "attest.boot": core.receipts.boot, "attest.model": str(d["model"]),
                    "gen_ai.request.model": str(d["name"] or Path(str(d["model"])).stem),
                    "attest.kv_tokens": d["kv_tokens"],
                    "attest.kv_sizing": str(d["kv_sizing"]), "attest.page_size": d["page_size"],
                    "attest.device": str(d["device"]), "attest.dtype": str(d["dtype"]),
                    "attest.attention_backend": str(d["attention_backend"]),
                    "attest.startup_s": round(core.startup_seconds, 3),
                })  # fmt: skip
        sink.append(core.receipts)
        RequestTraces.attach(core.scheduler, tracing)
        conn.send(("ready", d, core.tokenizer, _stats(core)))
    except BaseException as e:
        conn.send(("dead", f"engine failed to start: {type(e).__name__}: {e}"))
        tracing.shutdown()
        return
    try:
        _serve_loop(core, conn)
    finally:
        tracing.shutdown()  # bounded: a dead collector must not hold up the exit


def _serve_loop(core: Any, conn: Any) -> None:
    sched = core.scheduler
    try:
        while True:
            # block briefly when idle; never when there is work to do
            while conn.poll(0 if sched.has_work() else 0.5):
                msg = conn.recv()
                if msg[0] == "add":
                    _, rid, ids, params, trace_id = msg
                    try:
                        sched.add_request(ids, params, rid=rid, trace_id=trace_id)
                    except ValueError as e:
                        conn.send(("reject", rid, str(e)))
                elif msg[0] == "abort":
                    out = sched.abort(msg[1], reason=msg[2])
                    if out is not None:
                        conn.send(("out", [out], _stats(core)))
                elif msg[0] == "notice":  # the frontend's, written to the one boot log
                    core.receipts.notice(msg[1], msg[2], **msg[3])
                elif msg[0] == "stop":
                    _stop(core, conn, msg[1])
                    return
            if sched.has_work():
                outs = sched.step()
                if outs:  # a step that only prefilled has nothing to say yet
                    conn.send(("out", outs, _stats(core)))
    except (EOFError, BrokenPipeError):
        core.shutdown("frontend_gone")  # nobody to answer, but the log still ends honestly
    except BaseException as e:
        traceback.print_exc()
        try:
            conn.send(("dead", f"{type(e).__name__}: {e}"))
        except Exception:
            pass


def _stop(core: Any, conn: Any, reason: str) -> None:
    """An orderly stop: in-flight requests abort with receipts, ``boot.stop`` is written, and
    each waiting client hears that its request ended."""
    outs: list[Any] = []
    n = core.shutdown(reason, outs)
    if outs:
        conn.send(("out", outs, _stats(core)))
    conn.send(("stopped", reason, n))


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
        self._stats: dict[str, Any] = {}
        self._stopped = threading.Event()
        self.dead: str | None = None
        self.stopping: str | None = None  # the reason, once an orderly stop has begun
        self.on_dead = on_dead
        self.info: dict[str, Any] = {}
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
        if msg[0] != "ready":
            raise RuntimeError(msg[1])
        _, self.info, self.tokenizer, self._stats = msg
        self._reader.start()

    @property
    def max_context(self) -> int:
        return int(self.info["context"])

    @property
    def vocab_size(self) -> int:
        return int(self.info["vocab"])

    def drain(self, reason: str) -> None:
        """Begin an orderly stop: refuse new work; the scheduler aborts what is in flight
        (each with a receipt), writes ``boot.stop`` and exits. Safe to call more than once."""
        with self._send_lock:  # one order with submit: no request can slip in after the stop
            if self.stopping is not None or self.dead:
                return
            self.stopping = reason
            try:
                self._conn.send(("stop", reason))
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

    def _send(self, msg: tuple) -> None:
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
            try:
                self._conn.send(("add", sub.rid, sub.prompt_ids, sub.params, trace_id))
            except (OSError, ValueError) as e:  # it died before the reader noticed
                with self._subs_lock:
                    self._subs.pop(sub.rid, None)
                raise RuntimeError(f"scheduler is not running: {e}") from e

    def notice(self, key: str, text: str, **fields: Any) -> None:
        """Say something once in the boot log (the scheduler process writes it). Never raises."""
        if not self.dead:
            try:
                self._send(("notice", key, text, fields))
            except Exception:
                pass

    def abort(self, rid: str, reason: str = "client_disconnect") -> None:
        if not self.dead:
            try:
                self._send(("abort", rid, reason))
            except Exception:
                pass

    def stats(self) -> dict[str, Any]:
        return dict(self._stats)

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
            rids = list(self._subs)
        self._deliver([(rid, RuntimeError(message), True) for rid in rids])

    def _read(self) -> None:
        try:
            while True:
                msg = self._conn.recv()
                kind = msg[0]
                if kind == "out":
                    self._stats = msg[2]  # before the outputs: a finished request's memory is back
                    self._deliver([(out.rid, out, out.finished) for out in msg[1]])
                elif kind == "reject":
                    self._deliver([(msg[1], ValueError(msg[2]), True)])
                elif kind == "stopped":
                    self._fail_all(f"server is shutting down ({msg[1]})")
                    self._stopped.set()
                    return
                elif kind == "dead":
                    raise RuntimeError(msg[1])
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


def _put_all(puts: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in puts:
        queue.put_nowait(item)
