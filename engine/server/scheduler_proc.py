"""The scheduler process: build the engine, then step while there is work, answering the
frontend's messages (``engine.messages``) over the pipe.

This module runs in the scheduler process only. Its imports of the engine are inside
``scheduler_main`` so that the frontend, which names it as the process's target, never loads
torch or the model (import-linter's frontend contract ignores exactly those imports).
"""

from __future__ import annotations

import signal
import traceback
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.messages import (
    AbortRequest,
    AddRequest,
    Dead,
    EngineInfo,
    Notice,
    Outputs,
    Ready,
    Rejected,
    Stop,
    Stopped,
    ToScheduler,
)


def scheduler_main(config: EngineConfig, conn: Any) -> None:
    """The scheduler process: build the engine, then step while there is work."""
    # the frontend owns the terminal's signals; this process stops when told, over the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from engine.obs.tracing import setup_tracing

    sink: list[Any] = []  # the receipts, once the engine is built: where a dropped-span notice goes
    tracing = setup_tracing(
        config.otlp_endpoint,
        "scheduler",
        on_drop=lambda text: sink and sink[0].notice("spans_dropped", text, process="scheduler"),
    )
    try:
        from engine.core import EngineCore
        from engine.sched.traces import RequestTraces

        with tracing.span("boot", **{"attest.process": "scheduler"}) as span:
            core = EngineCore(config)
            info = core.info()
            if span is not None:
                span.set_attributes(_boot_attributes(core, info))
        sink.append(core.receipts)
        RequestTraces.attach(core.scheduler, tracing)
        ready = Ready(info=info, tokenizer=core.tokenizer, snapshot=core.scheduler.snapshot())
        conn.send(ready)
    except BaseException as e:
        conn.send(Dead(reason=f"engine failed to start: {type(e).__name__}: {e}"))
        tracing.shutdown()
        return
    try:
        _serve_loop(core, conn)
    finally:
        tracing.shutdown()  # bounded: a dead collector must not hold up the exit


def _boot_attributes(core: Any, info: EngineInfo) -> dict[str, Any]:
    return {
        "attest.boot": core.receipts.boot, "attest.model": info.model,
        "gen_ai.request.model": info.name or Path(info.model).stem,
        "attest.kv_tokens": info.kv_tokens, "attest.kv_sizing": info.kv_sizing,
        "attest.page_size": info.page_size, "attest.device": info.device,
        "attest.dtype": info.dtype, "attest.attention_backend": info.attention_backend,
        "attest.startup_s": round(core.startup_seconds, 3),
    }  # fmt: skip


def _serve_loop(core: Any, conn: Any) -> None:
    sched = core.scheduler
    try:
        while True:
            # block briefly when idle; never when there is work to do
            while conn.poll(0 if sched.has_work() else 0.5):
                if not _handle(core, conn, conn.recv()):
                    return
            if sched.has_work():
                outs = sched.step()
                if outs:  # a step that only prefilled has nothing to say yet
                    conn.send(Outputs(outputs=outs, snapshot=sched.snapshot()))
    except (EOFError, BrokenPipeError):
        core.shutdown("frontend_gone")  # nobody to answer, but the log still ends honestly
    except BaseException as e:
        traceback.print_exc()
        try:
            conn.send(Dead(reason=f"{type(e).__name__}: {e}"))
        except Exception:
            pass


def _handle(core: Any, conn: Any, msg: ToScheduler) -> bool:
    """Act on one message from the frontend; False once it said stop."""
    sched = core.scheduler
    match msg:
        case AddRequest(rid=rid, prompt_ids=ids, params=params, trace=trace):
            try:
                sched.add_request(ids, params, rid=rid, trace_id=trace)
            except ValueError as e:
                conn.send(Rejected(rid=rid, message=str(e)))
        case AbortRequest(rid=rid, reason=reason):
            out = sched.abort(rid, reason=reason)
            if out is not None:
                conn.send(Outputs(outputs=[out], snapshot=sched.snapshot()))
        case Notice(key=key, text=text, fields=fields):  # written to the one boot log
            core.receipts.notice(key, text, **fields)
        case Stop(reason=reason):
            _stop(core, conn, reason)
            return False
    return True


def _stop(core: Any, conn: Any, reason: str) -> None:
    """An orderly stop: in-flight requests abort with receipts, ``boot.stop`` is written, and
    each waiting client hears that its request ended."""
    outs: list[Any] = []
    n = core.shutdown(reason, outs)
    if outs:
        conn.send(Outputs(outputs=outs, snapshot=core.scheduler.snapshot()))
    conn.send(Stopped(reason=reason, in_flight=n))
