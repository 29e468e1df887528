"""The scheduler process: build the engine, then step while there is work, answering the
frontend's messages (``engine.request.messages``) over the pipe, every kind in one ``match``
(``_handle``).

This module runs in the scheduler process only: the frontend names the process's entry
(``engine.server.scheduler_entry``), which imports this module once that process runs, so the
HTTP process never loads torch or the model (import-linter's frontend contract ignores exactly
that import). Its runtime imports of the engine are inside ``scheduler_main`` all the same: the
process ignores Ctrl-C before torch loads, and an engine that fails to import is a ``Dead``
saying why, over the pipe.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engine.config import EngineConfig
from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.observability.stacks import dump_stacks_on_signal
from engine.request.messages import (
    HEARTBEAT_S,
    STALL_S,
    AbortRequest,
    AddRequest,
    CancelCutover,
    CheckpointDone,
    CheckpointOp,
    Cutover,
    CutoverDone,
    Dead,
    EngineInfo,
    Heartbeat,
    Launch,
    Notice,
    Outputs,
    PrepareGuide,
    Ready,
    Record,
    Rejected,
    Serving,
    StepOutput,
    Stop,
    Stopped,
    ToFrontend,
    ToScheduler,
)
from engine.server.stall import StallWatch, write_resume, write_stall

if TYPE_CHECKING:
    from engine.core.engine_core import EngineCore
    from engine.tiers.checkpoints import Pending

GUIDE_POLL_S = 0.002  # how often an idle loop looks for a finished grammar compile


class Pipe(Protocol):
    """The scheduler's end of the pipe (``multiprocessing``'s ``Connection``): the frontend's
    messages in, the scheduler's out."""

    def poll(self, timeout: float = ...) -> bool: ...
    def recv(self) -> ToScheduler: ...
    def send(self, obj: ToFrontend) -> None: ...


class Prepared(Protocol):
    """The prepared guides (``Grammars``): answers to send, compiles under way."""

    def answered(self) -> bool: ...
    def pending(self) -> bool: ...


class Waits(Protocol):
    """What the loop's wait reads of the scheduler."""

    grammars: Prepared

    def has_work(self) -> bool: ...


@dataclass(slots=True)
class _Drain:
    """An orderly stop under way: what is in flight may finish until ``deadline``."""

    reason: str
    deadline: float
    ended_before: int | None  # requests ended when a timed drain began; None: no drain
    cause: Mapping[str, Any] | None = None  # boot.stop's fields besides the reason (``Stop.cause``)


@dataclass(slots=True)
class _Serving:
    """What the loop keeps between messages: the engine, the pipe, the checkpoints whose prompt
    is being computed, whom to answer when the cutover under way ends, and a stop under way."""

    core: EngineCore
    conn: Pipe
    pending: Pending
    tickets: list[int] = field(default_factory=list)  # the cutover under way (at most one)
    drain: _Drain | None = None


def scheduler_main(config: EngineConfig, conn: Pipe, launch: Launch | None = None) -> None:
    """The scheduler process: build the engine, then step while there is work. ``launch``:
    the frontend's facts for the boot receipts (``boot.ready`` then waits for ``Serving``)."""
    # the frontend owns the terminal's signals; this process stops when told, over the pipe.
    # Its own process group: a signal to the frontend's whole group (Ctrl-C, `kill -- -PGID`,
    # a supervisor's stop) reaches the frontend, which drains this process in order
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    dump_stacks_on_signal()
    try:
        os.setpgid(0, 0)
    except PermissionError:  # a session leader may not move, and it leads its own group already
        if os.getpgid(0) != os.getpid():
            raise
    from engine.observability.tracing import setup_tracing

    # the receipts, once the engine is built: where a dropped-span notice goes
    sink: list[Receipts] = []
    tracing = setup_tracing(
        config.observability.otlp_endpoint,
        "scheduler",
        on_drop=lambda text: sink and sink[0].notice("spans_dropped", text, process="scheduler"),
    )
    try:
        from engine.core.group_boot import boot

        with tracing.span("boot", **{"attest.process": "scheduler"}) as span:
            core = boot(config, launch=launch, tracing=tracing)
            info = core.info()
            if span is not None:
                span.set_attributes(_boot_attributes(core, info))
        sink.append(core.receipts)
        ready = Ready(info=info, tokenizer=core.tokenizer, snapshot=core.scheduler.snapshot())
        conn.send(ready)
    except BaseException as e:
        conn.send(Dead(reason=f"engine failed to start: {type(e).__name__}: {e}"))
        tracing.shutdown()
        return
    try:
        _serve_loop(core, conn, STALL_S if launch is None else launch.stall_s)
    finally:
        tracing.shutdown()  # bounded: a dead collector must not hold up the exit


def _boot_attributes(core: EngineCore, info: EngineInfo) -> dict[str, Any]:
    return {
        "attest.boot": core.receipts.boot,
        "attest.model": info.model,
        "gen_ai.request.model": info.name or Path(info.model).stem,
        "attest.kv_tokens": info.kv_tokens,
        "attest.kv_sizing": info.kv_sizing,
        "attest.page_size": info.page_size,
        "attest.device": info.device,
        "attest.dtype": info.dtype,
        "attest.attention_backend": info.attention_backend,
        "attest.startup_s": round(core.startup_seconds, 3),
    }


def _serve_loop(core: EngineCore, conn: Pipe, stall_s: float = STALL_S) -> None:
    from engine.group.comm import GroupFailure
    from engine.tiers.checkpoints import Pending  # the engine's side: the scheduler's process only

    sched = core.scheduler
    serving = _Serving(core, conn, Pending())
    beat = time.monotonic() + HEARTBEAT_S
    watch = StallWatch(stall_s)
    try:
        while True:
            if (stall := watch.turn()) is not None:
                write_stall(core.receipts, stall, stall_s, sched.snapshot())
            arrived = 0  # requests handed in while a stall stood
            while conn.poll(_wait(sched)):  # asked again after each message: it may change it
                msg = conn.recv()
                if stall is not None and isinstance(msg, AddRequest):
                    arrived += msg.arrived is not None and msg.arrived < stall.seen
                _handle(serving, msg)
            if stall is not None:
                write_resume(core.receipts, stall, arrived)
            for ready in sched.grammars.poll():  # the prepared guides answered meanwhile
                conn.send(ready)
            if serving.tickets and (fields := core.cutovers.advance()) is not None:
                _answer(serving, serving.tickets.pop(), fields)
            if (drain := serving.drain) is not None and (
                not sched.has_work() or time.monotonic() >= drain.deadline
            ):
                _stop(serving, drain)
                return
            if sched.has_work():
                outs, answers = serving.pending.finish(core, core.step())
                for ticket, status, body in answers:
                    conn.send(CheckpointDone(ticket=ticket, status=status, body=body))
                if outs:  # a step that only prefilled has nothing to say yet
                    conn.send(Outputs(outputs=outs, snapshot=sched.snapshot()))
            if (now := time.monotonic()) >= beat:  # busy or idle: the frontend sees us turn
                conn.send(Heartbeat(snapshot=sched.snapshot()))
                beat = now + HEARTBEAT_S
    except (EOFError, BrokenPipeError):
        core.shutdown("frontend_gone")  # nobody to answer, but the log still ends honestly
    except GroupFailure as e:  # core.step wrote the receipts: the frontend must not again
        conn.send(Dead(reason=f"{type(e).__name__}: {e}", ended=True, said=_GROUP_FAILED[e.stop]))
    except BaseException as e:
        traceback.print_exc()
        try:
            said = f"the scheduler failed ({type(e).__name__})"
            conn.send(Dead(reason=f"{type(e).__name__}: {e}", said=said))
        except Exception:
            pass


def _wait(sched: Waits) -> float:
    """How long the loop may block on the pipe: not at all with work to do or a prepared guide's
    answer to send (a guide found compiled is answered on this turn), a moment while a grammar
    compiles (its answer comes from a worker), else a heartbeat's interval."""
    if sched.has_work() or sched.grammars.answered():
        return 0.0
    return GUIDE_POLL_S if sched.grammars.pending() else HEARTBEAT_S


# a failed group in a client's words: the collective's own text names source paths and the
# peers' addresses, which are the operator's to read (on stderr and in boot.stop), not a client's
_GROUP_FAILED = {
    "rank_lost": "the scheduler lost a rank",
    "group_split": "the scheduler's ranks were about to run different batches (a split)",
}


def _handle(serving: _Serving, msg: ToScheduler) -> None:
    """Act on one message from the frontend: every kind the pipe carries, here."""
    core, conn, sched = serving.core, serving.conn, serving.core.scheduler
    match msg:
        case AddRequest(rid=rid, prompt_ids=ids, params=params, trace=trace, promise=promise):
            try:
                sched.add_request(
                    ids,
                    params,
                    rid=rid,
                    trace_id=trace,
                    promise=promise,
                    arrived=msg.arrived,
                    api=msg.api,
                )
            except ValueError as e:
                conn.send(Rejected(rid=rid, message=str(e)))
        case AbortRequest(rid=rid, reason=reason):
            out = sched.abort(rid, reason=reason)
            if out is not None:
                conn.send(Outputs(outputs=[out], snapshot=sched.snapshot()))
        case PrepareGuide(guide=guide, ticket=ticket):  # compiled off the loop; poll answers
            sched.grammars.prepare(guide, ticket)
        case Notice(key=key, text=text, fields=fields):  # written to the one boot log
            core.receipts.notice(key, text, **fields)
        case Record(kind=kind, fields=fields) if kind in schema.FRONTEND_KINDS:
            core.receipts.emit(kind, **{**fields, "process": "frontend"})
        case Record():
            pass  # a kind that is not the frontend's to write: dropped
        case Serving(host=host, port=port):
            core.ready(host=host, port=port)
        case CheckpointOp():
            _checkpoint(serving, msg)
        case Cutover():
            _cutover(serving, msg)
        case CancelCutover():
            _cancel(serving, msg)
        case Stop() if serving.drain is None:
            serving.drain = _begin_drain(core, msg)
        case Stop():
            pass  # a stop under way already: the first one's drain goes on


def _checkpoint(serving: _Serving, msg: CheckpointOp) -> None:
    """Begin a checkpoint (its prompt runs first; ``Pending.finish`` answers it), or list or
    delete them, answered at once."""
    from engine.tiers import checkpoints

    try:
        if msg.op == "create":
            serving.pending.begin(serving.core, msg.ticket, list(msg.tokens or ()), msg.id)
            return
        status = 200
        body = (
            checkpoints.listing(serving.core)
            if msg.op == "list"
            else checkpoints.delete(serving.core, msg.id or "")
        )
    except checkpoints.CheckpointError as e:
        status, body = e.status, e.body()
    except ValueError as e:  # a prompt the scheduler refuses (too long, out of the vocabulary)
        status, body = 400, checkpoints.CheckpointError(400, str(e)).body()
    serving.conn.send(CheckpointDone(ticket=msg.ticket, status=status, body=body))


def _cutover(serving: _Serving, msg: Cutover) -> None:
    """Begin a cutover; answered at once when refused or done at this boundary, else when the
    loop's ``advance`` ends it."""
    fields = serving.core.cutovers.begin(msg)
    if fields is None:
        serving.tickets.append(msg.ticket)
    else:
        _answer(serving, msg.ticket, fields)


def _answer(serving: _Serving, ticket: int, fields: dict[str, Any]) -> None:
    """A cutover's end, with the pool as it left it: /health and /metrics show it at once."""
    serving.conn.send(
        CutoverDone(ticket=ticket, fields=fields, snapshot=serving.core.scheduler.snapshot())
    )


def _cancel(serving: _Serving, msg: CancelCutover) -> None:
    """Cancel the cutover ``msg.id`` under way: its own caller and the canceller both get its
    end; a cutover that is not under way is a 404 to the canceller."""
    fields = serving.core.cutovers.cancel(msg.id)
    if fields is None:
        under = serving.core.cutovers.active
        now = f"; {under.id} is under way" if under is not None else "; none is under way"
        fields = {
            "id": msg.id,
            "outcome": "not_found",
            "status": 404,
            "reason": f"no cutover {msg.id} is under way{now}",
        }
    else:
        if serving.tickets:  # the cutover's own caller: 409, cancelled
            _answer(serving, serving.tickets.pop(), fields)
        fields = {**fields, "status": 200}  # the canceller's: done
    _answer(serving, msg.ticket, fields)


def _begin_drain(core: EngineCore, msg: Stop) -> _Drain:
    """A stop with time to drain says so (``boot.drain``) when there is something to drain."""
    sched = core.scheduler
    if msg.drain_s > 0 and sched.has_work():
        core.receipts.emit(
            schema.BOOT_DRAIN,
            reason=msg.reason,
            in_flight=len(sched.requests),
            timeout_s=msg.drain_s,
        )
        return _Drain(msg.reason, time.monotonic() + msg.drain_s, _ended(core), msg.cause)
    return _Drain(msg.reason, time.monotonic(), None, msg.cause)


def _ended(core: EngineCore) -> int:
    counts = core.receipts.counts
    return counts[schema.REQUEST_FINISH] + counts[schema.REQUEST_ABORT]


def _stop(serving: _Serving, drain: _Drain) -> None:
    """An orderly stop: a cutover under way ends ``stopped`` (its caller is answered), what is
    still in flight aborts with receipts, ``boot.stop`` is written
    (with how many finished while draining), and each waiting client hears its request ended."""
    core = serving.core
    outs: list[StepOutput] = []
    if (fields := core.cutovers.halt(drain.reason)) is not None and serving.tickets:
        _answer(serving, serving.tickets.pop(), fields)
    before = drain.ended_before
    drained = None if before is None else _ended(core) - before
    n = core.shutdown(drain.reason, outs, drained, drain.cause)
    if outs:
        serving.conn.send(Outputs(outputs=outs, snapshot=core.scheduler.snapshot()))
    serving.conn.send(Stopped(reason=drain.reason, in_flight=n))
