"""EngineDriver: the scheduler in its own process, spoken to over a local pipe; what the frontend
hands it for one request (``Submission``), and the errors a dying scheduler (``SchedulerDied``)
and a start stopped before the engine was built (``StartStopped``) raise.

The frontend never touches the scheduler: it sends the small typed messages of
``engine.request.messages`` (add, abort, notice, stop) and receives each step's outputs, together with a
snapshot of the pool taken right after that step. Nothing here imports torch: the engine is built
in the scheduler process only.
A reader thread hands outputs to the asyncio queue of their request; a writer thread sends,
so a scheduler that is slow to read (or stopped) never blocks the event loop. Every message
from the scheduler process, its heartbeats included, says its loop still turns: ``heard`` is
when the last one came (``/health`` reports its age). If the scheduler process dies, every
waiting request hears it at once and the frontend reports it: nothing hangs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import multiprocessing as mp
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.model.tokenizer import Tokenizer
from engine.observability.death import how_it_ended
from engine.request.messages import (
    AbortRequest,
    AddRequest,
    CheckpointDone,
    CutoverDone,
    Dead,
    EngineInfo,
    GuideReady,
    Heartbeat,
    Launch,
    Notice,
    Outputs,
    PoolSnapshot,
    Ready,
    Record,
    Rejected,
    Serving,
    Stop,
    Stopped,
    ToFrontend,
    ToScheduler,
)
from engine.request.sampling_params import SamplingParams
from engine.server.scheduler_entry import run_scheduler

START_POLL_S = 0.1  # how often a start that waits for Ready looks for a stop asked meanwhile


@dataclass(slots=True)
class Submission:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    arrived: float | None = None  # the wall time the HTTP request came in
    api: str | None = None  # the HTTP API it came by (``chat.completions``, ``messages``, ...)


class SchedulerDied(RuntimeError):
    """The scheduler process said it is dying (``Dead``): the whole text, and ``said``."""

    def __init__(self, reason: str, said: str) -> None:
        super().__init__(reason)
        self.said = said


class StartStopped(Exception):
    """A stop was asked (``reason``: the signal's name) while the scheduler process built its
    engine; the process was ended (it reads no message before it is ready, and nothing was in
    flight)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"stopped by {reason} while the engine was being built")
        self.reason = reason


class EngineDriver:
    """The frontend's handle on the scheduler process.

    ``on_dead`` is called once, from the reader thread, when the scheduler process dies or
    reports a fatal error, with the error's whole text (clients read ``dead``, which holds no
    path and no address): the server prints it and stops with a non-zero status. ``launch``: this
    boot's facts for the scheduler's boot receipts; ``drain_s``: how long an orderly stop lets
    the requests in flight finish before aborting them; ``stall_s``: how long a silence of the
    scheduler process is a stall (``/health`` answers 503 past it)."""

    def __init__(
        self,
        config: EngineConfig,
        on_dead: Callable[[str], None] | None = None,
        launch: Launch | None = None,
        drain_s: float = 0.0,
        stall_s: float = 10.0,
    ) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=run_scheduler,
            args=(config, child, launch),
            name="attest-scheduler",
            daemon=True,
        )
        self._child = child
        self.config = config
        self.drain_s = drain_s
        self.stall_s = stall_s
        self._send_lock = threading.Lock()  # one order for submit, drain and the messages
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._subs: dict[str, Submission] = {}
        self._subs_lock = threading.Lock()
        # cutovers and prepared guides waiting for their answer, by ticket, under _subs_lock
        self._asked: dict[int, concurrent.futures.Future] = {}
        self._tickets = itertools.count(1)
        self._snapshot = PoolSnapshot()
        self._stopped = threading.Event()
        # why the scheduler is gone, in words a client may read (no path, no address); the
        # whole text goes to on_dead (stderr)
        self.dead: str | None = None
        self.ended_itself = False  # the scheduler wrote its own boot.stop before it died
        self.lost_at_death: list[str] = []  # requests waiting on the scheduler when it died
        self.exit_code: int | None = None  # the dead scheduler process's (-N: signal N)
        self.heard = time.monotonic()  # when the scheduler process last said anything
        self._stall_said = False
        self.stopping: str | None = None  # the reason, once an orderly stop has begun
        self.on_dead = on_dead
        self.info: EngineInfo | None = None  # set by start()
        self.tokenizer: Tokenizer | None = None  # set by start()
        self._reader = threading.Thread(target=self._read, name="attest-ipc-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name="attest-ipc-writer", daemon=True)

    def start(self, timeout: float = 600, stop: Callable[[], str | None] = lambda: None) -> None:
        """Start the scheduler process and wait until its engine is built. A RuntimeError
        saying why where it is not; the process has exited by then (it writes no more).
        ``stop``: a stop asked meanwhile (its reason, else None) ends the process at once and
        raises StartStopped (a model may take minutes to load, or never load)."""
        self._proc.start()
        self._child.close()
        deadline = time.monotonic() + timeout
        while not self._conn.poll(START_POLL_S):
            if (reason := stop()) is not None:
                self._end_unready(grace=0)
                raise StartStopped(reason)
            if time.monotonic() >= deadline:
                self._end_unready()
                raise RuntimeError(f"scheduler process did not become ready in {timeout:.0f} s")
        try:
            msg = self._conn.recv()
        except EOFError:  # it died while building the engine (killed, out of memory)
            self._end_unready()
            raise RuntimeError(
                f"scheduler process {how_it_ended(self._proc.exitcode)} before it was ready"
            ) from None
        if not isinstance(msg, Ready):
            self._end_unready()  # it returns once it has said why
            raise RuntimeError(msg.reason)  # Dead: why the engine could not start
        self.info, self.tokenizer, self._snapshot = msg.info, msg.tokenizer, msg.snapshot
        self.heard = time.monotonic()
        self._reader.start()
        self._writer.start()

    def _end_unready(self, grace: float = 10.0) -> None:
        """The scheduler process that will not serve has exited when this returns: given
        ``grace`` seconds to, then terminated, then killed."""
        self._proc.join(grace)
        for end in (self._proc.terminate, self._proc.kill):
            if self._proc.is_alive():
                end()
                self._proc.join(5)

    @property
    def pid(self) -> int | None:
        """The scheduler process's pid."""
        return self._proc.pid

    def heartbeat_age(self) -> float:
        """Seconds since the scheduler process last said anything (it beats every 0.5 s)."""
        return time.monotonic() - self.heard

    def stalled(self) -> float | None:
        """The silence's age when it is past ``stall_s`` (the scheduler stopped turning), else
        None. Its start and its end are each said once on stderr."""
        age = self.heartbeat_age()
        stalled = age > self.stall_s and not self.dead
        if stalled != self._stall_said:
            self._stall_said = stalled
            what = "has not been heard from for" if stalled else "is heard from again after"
            print(
                f"attest: the scheduler process (pid {self.pid}) {what} {age:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        return age if stalled else None

    def serving(self, host: str, port: int) -> None:
        """The HTTP socket serves: the scheduler process writes ``boot.ready``."""
        self._send(Serving(host=host, port=port))

    @property
    def max_context(self) -> int:
        return self.info.context

    @property
    def vocab_size(self) -> int:
        return self.info.vocab

    @property
    def kv_tokens(self) -> int:
        """The pool a request is promised against: the group's agreed capacity as of the
        latest snapshot (a pool cutover's answer brings the new one), the boot's before any."""
        return self._snapshot.kv_total or self.info.kv_tokens

    def drain(self, reason: str, cause: Mapping[str, Any] | None = None) -> None:
        """Begin an orderly stop: refuse new work; the scheduler lets what is in flight finish
        for up to ``drain_s``, aborts the rest (each with a receipt), writes ``boot.stop`` (with
        ``cause``'s fields) and exits. Safe to call more than once."""
        with self._send_lock:  # one order with submit: no request can slip in after the stop
            if self.stopping is not None or self.dead:
                return
            self.stopping = reason
            self._outbox.put(Stop(reason=reason, drain_s=self.drain_s, cause=dict(cause or {})))

    def stop(
        self,
        reason: str = "shutdown",
        timeout: float | None = None,
        cause: Mapping[str, Any] | None = None,
    ) -> None:
        """Drain and wait for the scheduler process to exit: ``drain_s`` plus ``timeout``
        (default 10 s) at most, then it is terminated, and killed if that does not end it
        (a stopped process does not act on SIGTERM). ``cause``: as ``drain``'s."""
        self.drain(reason, cause)
        deadline = time.monotonic() + self.drain_s + (10.0 if timeout is None else timeout)
        self._stopped.wait(max(0.0, deadline - time.monotonic()))
        self._proc.join(max(0.0, deadline - time.monotonic()))
        for end, sig in ((self._proc.terminate, "SIGTERM"), (self._proc.kill, "SIGKILL")):
            if self._proc.is_alive():
                print(
                    f"attest: the scheduler process (pid {self.pid}) did not stop in time; "
                    f"sending {sig}",
                    file=sys.stderr,
                    flush=True,
                )
                end()
                self._proc.join(5)
        if self._reader.is_alive():  # it reports a death it saw (on_dead) before we return
            self._reader.join(5)

    def _send(self, msg: ToScheduler) -> None:
        with self._send_lock:
            self._outbox.put(msg)

    def _write(self) -> None:
        """The one thread that writes to the pipe: a slow reader blocks it, never the caller.
        A failed send ends it; the reader reports the death. It outlives a ``Stop``: a client
        that leaves during the drain still aborts its request."""
        while True:
            msg = self._outbox.get()
            try:
                self._conn.send(msg)
            except (OSError, ValueError):
                return

    def submit(self, sub: Submission, trace_id: str | None = None) -> None:
        """``trace_id``: the W3C traceparent the request's scheduler spans go under (or None)."""
        with self._send_lock:
            if self.stopping:
                raise RuntimeError(f"server is shutting down ({self.stopping})")
            with self._subs_lock:  # one order with _fail_all: a dead driver takes no request
                if self.dead:
                    raise RuntimeError(f"scheduler is not running: {self.dead}")
                self._subs[sub.rid] = sub
            # a send that fails is a death the reader reports to every request, this one too
            self._outbox.put(
                AddRequest(
                    rid=sub.rid,
                    prompt_ids=sub.prompt_ids,
                    params=sub.params,
                    trace=trace_id,
                    promise=True,
                    arrived=sub.arrived,
                    api=sub.api,
                )
            )

    def _tell(self, msg: ToScheduler) -> None:
        """Send what needs no answer; never raises, and nothing once the scheduler is dead."""
        if not self.dead:
            try:
                self._send(msg)
            except Exception:
                pass

    def notice(self, key: str, text: str, **fields: Any) -> None:
        """Say something once in the boot log (the scheduler process writes it)."""
        self._tell(Notice(key=key, text=text, fields=fields))

    def record(self, kind: str, **fields: Any) -> None:
        """Write a receipt of the frontend's own (``schema.FRONTEND_KINDS``) to the one boot
        log (the scheduler process writes it; once it is dead, its boot.stop ends the log)."""
        self._tell(Record(kind=kind, fields=fields))

    def abort(self, rid: str, reason: str = "client_disconnect") -> None:
        self._tell(AbortRequest(rid=rid, reason=reason))

    def ask(self, message: Callable[[int], ToScheduler]) -> concurrent.futures.Future:
        """Send the message made for a new ticket (a ``Cutover``, ``CancelCutover``,
        ``CheckpointOp``, ``PrepareGuide``); its answer fills the future: a cutover's end fields,
        a checkpoint's (status, body), a ``GuideReady`` (a RuntimeError when the scheduler stops
        or dies first, or is not serving now)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._send_lock:
            with self._subs_lock:
                if self.dead or self.stopping:
                    raise RuntimeError(f"scheduler is not serving: {self.dead or self.stopping}")
                ticket = next(self._tickets)
                self._asked[ticket] = fut
            self._outbox.put(message(ticket))
        return fut

    def _answer(self, ticket: int, result: Any) -> None:
        with self._subs_lock:
            fut = self._asked.pop(ticket, None)
        if fut is not None:
            fut.set_result(result)

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
                self.lost_at_death = list(self._subs)
            rids = list(self._subs)
            asked, self._asked = list(self._asked.values()), {}
        self._deliver([(rid, RuntimeError(message), True) for rid in rids])
        for fut in asked:
            fut.set_exception(RuntimeError(message))

    def _read(self) -> None:
        try:
            while self._on(self._conn.recv()):
                self.heard = time.monotonic()
        except (EOFError, OSError, RuntimeError) as e:
            self._proc.join(1)
            self.exit_code = code = self._proc.exitcode
            whole = dead = f"scheduler process {how_it_ended(code)}"
            if isinstance(e, SchedulerDied):
                whole, dead = str(e), f"{e.said}; the server cannot serve"
            elif isinstance(e, RuntimeError):
                whole = f"{dead} ({type(e).__name__}: {e})"
            self._fail_all(f"scheduler failed: {dead}", dead=dead)
            self._stopped.set()
            if self.on_dead is not None:
                self.on_dead(whole)

    def _on(self, msg: ToFrontend) -> bool:
        """Act on one message from the scheduler process; False once it has stopped."""
        match msg:
            case Outputs(outputs=outs, snapshot=snap):
                self._snapshot = snap  # before the outputs: a finished request's memory is back
                self._deliver([(out.rid, out, out.finished) for out in outs])
            case Heartbeat(snapshot=snap):
                self._snapshot = snap
            case Rejected(rid=rid, message=message):
                self._deliver([(rid, ValueError(message), True)])
            case CutoverDone(ticket=ticket, fields=fields, snapshot=snap):
                if snap is not None:  # the pool as the cutover left it, before the answer
                    self._snapshot = snap
                self._answer(ticket, dict(fields))
            case GuideReady(ticket=ticket):
                self._answer(ticket, msg)
            case CheckpointDone(ticket=ticket, status=status, body=body):
                self._answer(ticket, (status, dict(body)))
            case Stopped(reason=reason):
                self._fail_all(f"server is shutting down ({reason})")
                self._stopped.set()
                return False
            case Dead(reason=reason, ended=ended, said=said):
                self.ended_itself = ended
                raise SchedulerDied(reason, said)
        return True


def _put_all(puts: list[tuple[asyncio.Queue, object]]) -> None:
    for q, item in puts:
        q.put_nowait(item)
