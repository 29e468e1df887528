"""The OpenAI-compatible HTTP API over an EngineDriver: the routes, request parsing, and the
service that runs one completion request (prompt check, trace, job, response)."""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import Awaitable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from engine.model.chat import ChatTemplateError
from engine.obs import tracing as tr
from engine.obs.metrics import CONTENT_TYPE, ServerMetrics
from engine.prompt import PromptError, check_prompt
from engine.server.driver import EngineDriver
from engine.server.job import Job, JobFailed
from engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ProtocolError,
    field_path,
    sampling_params,
)
from engine.server.responses import completion_body, error_response, stream

VERSION = "0.1.0"
MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_TOKENS = 256


async def parse(request: Request, model: type[BaseModel], served_model_name: str) -> Any:
    """The request body as ``model``; every fault is a ProtocolError naming the field."""
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


class CompletionService:
    """Runs completion requests against a started driver: prompt checks, the request's trace,
    the job in the scheduler, and the response. With tracing on, each request gets a SERVER
    span that continues an incoming ``traceparent``."""

    def __init__(
        self, driver: EngineDriver, metrics: ServerMetrics, served_name: str, tracing: tr.Tracing
    ) -> None:
        self.driver = driver
        self.metrics = metrics
        self.served_name = served_name
        self.tracing = tracing

    async def completions(self, request: Request) -> Response:
        t0 = time.time_ns()
        req = await parse(request, CompletionRequest, self.served_name)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ProtocolError("batched prompts are not supported; send one prompt", "prompt")
            prompt = prompt[0]
        tok = self.driver.tokenizer
        ids = tok.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return await self.run(ids, req, "text", request, t0)

    async def chat(self, request: Request) -> Response:
        t0 = time.time_ns()
        req = await parse(request, ChatCompletionRequest, self.served_name)
        try:
            messages = [m.model_dump() for m in req.messages]
            ids = self.driver.tokenizer.encode_chat(messages, req.add_generation_prompt)
        except ChatTemplateError as e:
            raise ProtocolError(str(e), "messages") from e
        return await self.run(ids, req, "chat", request, t0)

    def check_prompt(self, ids: list[int]) -> None:
        try:
            check_prompt(
                ids, vocab_size=self.driver.vocab_size, max_context=self.driver.max_context
            )
        except PromptError as e:
            raise ProtocolError(str(e), e.param) from e

    async def run(self, ids: list[int], req: Any, kind: str, request: Request, t0: int) -> Response:
        """Check, submit and answer one request (``kind``: ``"text"`` or ``"chat"``)."""
        self.check_prompt(ids)
        params = sampling_params(req, len(ids), self.driver.max_context, DEFAULT_MAX_TOKENS)
        rid = f"{'cmpl' if kind == 'text' else 'chatcmpl'}-{uuid.uuid4().hex[:24]}"
        job = Job(self.driver, self.metrics, rid, ids, params, req.n, t0)
        self.trace(job, request, kind, req, params, t0)
        try:
            job.submit()
        except JobFailed as e:
            job.end_span(e.status, str(e))
            return error_response(str(e), e.status)
        meta = {"id": rid, "created": int(time.time()), "model": self.served_name}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                stream(job, kind, meta, include_usage), media_type="text/event-stream"
            )
        return await self.collect(job, kind, meta, req.n, request)

    async def collect(
        self, job: Job, kind: str, meta: dict[str, Any], n: int, request: Request
    ) -> Response:
        """The whole response at once, unless the client hangs up first (then 499, aborted)."""
        texts: list[list[str]] = [[] for _ in range(n)]

        async def gather() -> None:
            async for i, out in job.events():
                texts[i].append(out.text_delta)

        try:
            if not await unless_disconnected(gather(), request):
                job.end_span(499, "the client went away")
                return Response(status_code=499)  # nobody reads it; the request is aborted
        except JobFailed as e:
            job.end_span(e.status, str(e))
            return error_response(str(e), e.status)
        except BaseException:
            job.end_span(499, "the client went away")
            raise
        finally:
            job.close()  # nothing, unless the client went away (cancelled) mid-request
        job.end_span(200)
        return JSONResponse(completion_body(job, kind, meta, texts))

    def trace(self, job: Job, request: Request, kind: str, req: Any, params: Any, t0: int) -> None:
        """The request's trace context: a server span (tracing on), else an incoming
        traceparent passed through so the receipts still name the caller's trace."""
        headers, tracing, name = request.headers, self.tracing, self.served_name
        if not tracing.enabled:
            incoming = headers.get("traceparent")
            job.trace = incoming if tr.parse_traceparent(incoming) else None
            return
        try:
            op = "text_completion" if kind == "text" else "chat"
            attrs = tr.request_attributes(op, name, params, req.n, bool(req.stream))
            attrs.update({"gen_ai.response.id": job.rid, "gen_ai.response.model": name,
                          "attest.rid": job.rid, "http.request.method": "POST",
                          "url.path": request.url.path})  # fmt: skip
            job.span = tracing.start_span(
                f"{op} {name}", parent=tracing.context_from(headers), kind="SERVER",
                start_ns=t0, attributes=attrs,
            )  # fmt: skip
            job.trace = tr.traceparent_of(job.span)
        except Exception:
            job.span = None  # tracing never fails a request


async def unless_disconnected(work: Awaitable[None], request: Request) -> bool:
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


def health(driver: EngineDriver) -> Response:
    """200 with the pool's gauges while serving; 503 naming why not."""
    if driver.dead:
        return error_response(f"scheduler is not running: {driver.dead}", 503)
    if driver.stopping:
        return error_response(f"server is shutting down ({driver.stopping})", 503)
    return JSONResponse({"status": "ok", **driver.stats().gauges()})


def model_list(driver: EngineDriver, served_name: str) -> dict[str, Any]:
    card = {"id": served_name, "object": "model", "created": 0, "owned_by": "attest",
            "max_model_len": driver.max_context}  # fmt: skip
    return {"object": "list", "data": [card]}


def create_app(
    driver: EngineDriver,
    served_model_name: str,
    api_key: str | None = None,
    tracing: tr.Tracing = tr.DISABLED,
) -> FastAPI:
    """The HTTP app over a started driver (the scheduler process is already up)."""
    app = FastAPI(title="Attest", version=VERSION)
    metrics = ServerMetrics(driver.stats)
    service = CompletionService(driver, metrics, served_model_name, tracing)

    @app.middleware("http")
    async def _guard(request: Request, call_next: Any) -> Response:
        if api_key and request.url.path.startswith("/v1/"):
            got = request.headers.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {api_key}".encode()):
                return error_response("invalid or missing API key", 401)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return error_response(f"request body exceeds {MAX_BODY_BYTES} bytes", 413)
        return await call_next(request)

    @app.exception_handler(ProtocolError)
    async def _protocol_error(_: Request, e: ProtocolError) -> JSONResponse:
        return error_response(str(e), e.status, e.param)

    @app.get("/health")
    async def _health() -> Response:
        return health(driver)

    @app.get("/metrics")
    async def _metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/version")
    async def _version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/v1/models")
    async def _models() -> dict[str, Any]:
        return model_list(driver, served_model_name)

    app.post("/v1/completions")(service.completions)
    app.post("/v1/chat/completions")(service.chat)
    return app
