"""The OpenAI-compatible HTTP API over an EngineDriver."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from engine.model.chat import ChatTemplateError
from engine.obs import tracing as tr
from engine.obs.metrics import CONTENT_TYPE, ServerMetrics
from engine.sched.scheduler import StepOutput
from engine.server.driver import EngineDriver, Submission
from engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ProtocolError,
    error_body,
    field_path,
    sampling_params,
)

VERSION = "0.1.0"
MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_TOKENS = 256


def _error(message: str, status: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status)


class _Failed(Exception):
    """A request that cannot complete: the scheduler refused it, died, or is stopping."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Run:
    """One HTTP request's choices in the scheduler (``n`` requests sharing one queue): yields
    each output with its choice index, times it for /metrics, and aborts whatever has not
    finished when it is closed (a client that went away)."""

    def __init__(
        self,
        driver: EngineDriver,
        metrics: ServerMetrics,
        rid: str,
        ids: list[int],
        params,
        n: int,
        t0_ns: int,
    ) -> None:
        self.driver = driver
        self.rid = rid
        self.queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        rids = [rid] if n == 1 else [f"{rid}-{i}" for i in range(n)]
        self.subs = [
            # several seeded choices must still differ: each draws from its own seed
            Submission(r, ids, _choice_params(params, i), loop, self.queue)
            for i, r in enumerate(rids)
        ]
        self.index = {r: i for i, r in enumerate(rids)}
        self.open = set(rids)
        # time to first token counts from the request's arrival (t0_ns), for /metrics and spans
        self.started_ns = t0_ns
        self.timers = [metrics.timer(len(ids) if i == 0 else 0, t0_ns) for i in range(n)]
        self.completion = [0] * n
        self.cached = 0
        self.prompt_tokens = len(ids)
        self.reasons: list[str | None] = [None] * n
        self.parks = self.retractions = 0
        self.trace: str | None = None  # the traceparent the scheduler's spans go under
        self.span: Any = None  # the HTTP server span (tracing on)

    def submit(self) -> None:
        try:
            for sub in self.subs:
                self.driver.submit(sub, self.trace)
        except RuntimeError as e:
            self.close()
            raise _Failed(str(e), 503) from e

    async def events(self) -> AsyncIterator[tuple[int, StepOutput]]:
        while self.open:
            item = await self.queue.get()
            if isinstance(item, Exception):
                raise _Failed(str(item), 400 if isinstance(item, ValueError) else 503)
            i = self.index[item.rid]
            n_new = len(item.new_token_ids)
            self.timers[i].tokens(n_new, item.cached_tokens)
            self.completion[i] += n_new
            self.cached = max(self.cached, item.cached_tokens)
            if item.finished:
                self.open.discard(item.rid)
                self.reasons[i] = item.finish_reason
                self.parks += item.parks
                self.retractions += item.retractions
                self.timers[i].end(item.finish_reason)
                if item.finish_reason == "abort" and self.driver.stopping:
                    raise _Failed(
                        f"server is shutting down ({self.driver.stopping}); the request was aborted",
                        503,
                    )
            yield i, item

    def close(self) -> None:
        for rid in self.open:
            self.driver.abort(rid)
            self.timers[self.index[rid]].end("abort")
        self.open = set()

    def end_span(self, status: int, error: str | None = None) -> None:
        """End the server span (once) with what the response reports. Never raises."""
        span, self.span = self.span, None
        if span is None:
            return
        try:
            u = self.usage()
            first = min((t.first_ns for t in self.timers if t.first_ns), default=None)
            ttft = None if first is None else (first - self.started_ns) / 1e9
            span.set_attributes(tr.clean({
                "http.response.status_code": status,
                "gen_ai.usage.input_tokens": u["prompt_tokens"],
                "gen_ai.usage.output_tokens": u["completion_tokens"],
                "gen_ai.usage.cache_read.input_tokens": self.cached,
                "gen_ai.response.finish_reasons": [r or "" for r in self.reasons],
                "attest.cached_tokens": self.cached, "attest.parks": self.parks,
                "attest.retractions": self.retractions,
                "attest.ttft_s": None if ttft is None else round(ttft, 6),
            }))  # fmt: skip
            if error is not None:
                tr.set_error(span, error)
            span.end()
        except Exception:
            pass  # tracing never fails a request

    def usage(self) -> dict[str, Any]:
        done = sum(self.completion)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }


def _choice_params(params, i: int):
    if i == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + i)


def create_app(
    driver: EngineDriver,
    served_model_name: str,
    api_key: str | None = None,
    tracing: tr.Tracing = tr.DISABLED,
) -> FastAPI:
    """The HTTP app over a started driver (the scheduler process is already up). With tracing
    on, each completion request gets a SERVER span that continues an incoming ``traceparent``."""

    app = FastAPI(title="Attest", version=VERSION)
    metrics = ServerMetrics(driver.stats)
    tok = driver.tokenizer

    @app.middleware("http")
    async def _guard(request: Request, call_next: Any) -> Response:
        if api_key and request.url.path.startswith("/v1/"):
            got = request.headers.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {api_key}".encode()):
                return _error("invalid or missing API key", 401)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return _error(f"request body exceeds {MAX_BODY_BYTES} bytes", 413)
        return await call_next(request)

    async def parse(request: Request, model: type[BaseModel]) -> Any:
        body = bytearray()
        async for part in request.stream():  # bounded even when no length was declared
            body += part
            if len(body) > MAX_BODY_BYTES:
                raise ProtocolError(f"request body exceeds {MAX_BODY_BYTES} bytes", None, 413)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise ProtocolError(f"request body is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ProtocolError("request body must be a JSON object")
        try:
            req = model.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            param = field_path(model, first["loc"])
            raise ProtocolError(f"{param}: {first['msg']}", param) from e
        if req.model not in (None, served_model_name):
            raise ProtocolError(
                f"model {req.model!r} does not exist; this server serves {served_model_name!r}",
                "model",
                404,
            )
        return req

    def check_prompt(ids: list[int]) -> None:
        if not ids:
            raise ProtocolError("prompt is empty", "prompt")
        if len(ids) >= driver.max_context:
            raise ProtocolError(
                f"prompt has {len(ids)} tokens; the context limit is {driver.max_context}", "prompt"
            )
        if any(not 0 <= t < driver.vocab_size for t in ids):
            raise ProtocolError("prompt contains a token id outside the vocabulary", "prompt")

    def trace(job: _Run, request: Request, kind: str, req: Any, params: Any, t0: int) -> None:
        """The request's trace context: a server span (tracing on), else an incoming
        traceparent passed through so the receipts still name the caller's trace."""
        headers = request.headers
        if not tracing.enabled:
            incoming = headers.get("traceparent")
            job.trace = incoming if tr.parse_traceparent(incoming) else None
            return
        try:
            op = "text_completion" if kind == "text" else "chat"
            attrs = tr.request_attributes(op, served_model_name, params, req.n, bool(req.stream))
            attrs.update({"gen_ai.response.id": job.rid, "gen_ai.response.model": served_model_name,
                          "attest.rid": job.rid, "http.request.method": "POST",
                          "url.path": request.url.path})  # fmt: skip
            job.span = tracing.start_span(
                f"{op} {served_model_name}", parent=tracing.context_from(headers), kind="SERVER",
                start_ns=t0, attributes=attrs,
            )  # fmt: skip
            job.trace = tr.traceparent_of(job.span)
        except Exception:
            job.span = None  # tracing never fails a request

    async def run(ids: list[int], req: Any, kind: str, request: Request, t0: int) -> Response:
        params = sampling_params(req, len(ids), driver.max_context, DEFAULT_MAX_TOKENS)
        rid = f"{'cmpl' if kind == 'text' else 'chatcmpl'}-{uuid.uuid4().hex[:24]}"
        job = _Run(driver, metrics, rid, ids, params, req.n, t0)
        trace(job, request, kind, req, params, t0)
        try:
            job.submit()
        except _Failed as e:
            job.end_span(e.status, str(e))
            return _error(str(e), e.status)
        meta = {"id": rid, "created": int(time.time()), "model": served_model_name}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _stream(job, kind, meta, include_usage), media_type="text/event-stream"
            )
        texts = [[] for _ in range(req.n)]

        async def collect() -> None:
            async for i, out in job.events():
                texts[i].append(out.text_delta)

        try:
            if not await _unless_disconnected(collect(), request):
                job.end_span(499, "the client went away")
                return Response(status_code=499)  # nobody reads it; the request is aborted
        except _Failed as e:
            job.end_span(e.status, str(e))
            return _error(str(e), e.status)
        except BaseException:
            job.end_span(499, "the client went away")
            raise
        finally:
            job.close()  # nothing, unless the client went away (cancelled) mid-request
        job.end_span(200)
        choices = []
        for i, (parts, reason) in enumerate(zip(texts, job.reasons)):
            choice: dict[str, Any] = {"index": i, "finish_reason": reason, "logprobs": None}
            if kind == "text":
                choice["text"] = "".join(parts)
            else:
                choice["message"] = {"role": "assistant", "content": "".join(parts)}
            choices.append(choice)
        obj = "text_completion" if kind == "text" else "chat.completion"
        return JSONResponse({**meta, "object": obj, "choices": choices, "usage": job.usage()})

    @app.exception_handler(ProtocolError)
    async def _protocol_error(_: Request, e: ProtocolError) -> JSONResponse:
        return _error(str(e), e.status, e.param)

    @app.get("/health")
    async def health() -> Response:
        if driver.dead:
            return _error(f"scheduler is not running: {driver.dead}", 503)
        if driver.stopping:
            return _error(f"server is shutting down ({driver.stopping})", 503)
        stats = driver.stats()
        stats.pop("receipts", None)
        return JSONResponse({"status": "ok", **stats})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": served_model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "attest",
                    "max_model_len": driver.max_context,
                }
            ],
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        t0 = time.time_ns()
        req = await parse(request, CompletionRequest)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ProtocolError("batched prompts are not supported; send one prompt", "prompt")
            prompt = prompt[0]
        ids = tok.encode(prompt) if isinstance(prompt, str) else list(prompt)
        check_prompt(ids)
        return await run(ids, req, "text", request, t0)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        t0 = time.time_ns()
        req = await parse(request, ChatCompletionRequest)
        try:
            messages = [m.model_dump() for m in req.messages]
            ids = tok.encode_chat(messages, req.add_generation_prompt)
        except ChatTemplateError as e:
            raise ProtocolError(str(e), "messages") from e
        check_prompt(ids)
        return await run(ids, req, "chat", request, t0)

    return app


async def _unless_disconnected(work: Any, request: Request) -> bool:
    """Run ``work`` unless the client hangs up first (the body is already read, so the next
    message can only be the disconnect). False when it hung up; the caller aborts."""
    task = asyncio.ensure_future(work)

    async def hangup() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(hangup())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task.done():
        task.result()  # re-raise what the work raised
        return True
    task.cancel()
    return False


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _stream(
    job: _Run, kind: str, meta: dict[str, Any], include_usage: bool
) -> AsyncIterator[bytes]:
    obj = "text_completion" if kind == "text" else "chat.completion.chunk"

    def chunk(i: int, text: str | None, reason: str | None, first: bool = False) -> bytes:
        if kind == "text":
            choice: dict[str, Any] = {"index": i, "text": text or "", "logprobs": None}
        else:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": i, "delta": delta, "logprobs": None}
        choice["finish_reason"] = reason
        return _sse({**meta, "object": obj, "choices": [choice]})

    status, error = 499, "the client went away"
    try:
        if kind == "chat":
            for i in range(len(job.subs)):
                yield chunk(i, "", None, first=True)
        try:
            async for i, item in job.events():
                if item.text_delta or item.finished:
                    yield chunk(i, item.text_delta, item.finish_reason if item.finished else None)
        except _Failed as e:
            status, error = e.status, str(e)
            yield _sse(error_body(str(e), e.status))
        else:
            status, error = 200, None
            if include_usage:
                yield _sse({**meta, "object": obj, "choices": [], "usage": job.usage()})
        yield b"data: [DONE]\n\n"
    finally:
        job.close()  # a client that disconnected: its requests abort and their memory is freed
        job.end_span(status, error)
