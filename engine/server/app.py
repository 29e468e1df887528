"""The OpenAI-compatible HTTP API over an EngineDriver."""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from engine.model.chat import ChatTemplateError
from engine.sched.scheduler import StepOutput
from engine.server.driver import EngineDriver, Submission
from engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ProtocolError,
    error_body,
    sampling_params,
)

MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_TOKENS = 256


def _error(message: str, status: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status)


def create_app(driver: EngineDriver, served_model_name: str, api_key: str | None = None) -> FastAPI:
    """The HTTP app over a started driver (the scheduler process is already up)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            driver.stop()

    app = FastAPI(title="Attest", version="0.1.0", lifespan=lifespan)
    app.state.driver = driver
    tok = driver.tokenizer

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Response:
        if api_key and request.url.path.startswith("/v1/"):
            got = request.headers.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {api_key}".encode()):
                return _error("invalid or missing API key", 401)
        return await call_next(request)

    async def parse(request: Request, model: type[BaseModel]) -> Any:
        body = await request.body()
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
            loc = ".".join(str(x) for x in first["loc"])
            raise ProtocolError(f"{loc}: {first['msg']}", loc) from e
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

    async def run(ids: list[int], req: Any, kind: str) -> Response:
        params = sampling_params(req, len(ids), driver.max_context, DEFAULT_MAX_TOKENS)
        rid = f"{'cmpl' if kind == 'text' else 'chatcmpl'}-{uuid.uuid4().hex[:24]}"
        loop = asyncio.get_running_loop()
        sub = Submission(rid, ids, params, loop, asyncio.Queue())
        try:
            driver.submit(sub)
        except RuntimeError as e:
            return _error(str(e), 503)
        created = int(time.time())
        model = served_model_name
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if req.stream:
            return StreamingResponse(
                _stream(sub, kind, rid, created, model, len(ids), include_usage, driver),
                media_type="text/event-stream",
            )
        text, n_out, reason = [], 0, None
        try:
            while True:
                item = await sub.out.get()
                if isinstance(item, Exception):
                    status = 400 if isinstance(item, ValueError) else 503
                    return _error(str(item), status)
                text.append(item.text_delta)
                n_out += len(item.new_token_ids)
                sub.cached = item.cached_tokens
                if item.finished:
                    reason = item.finish_reason
                    break
        finally:
            if reason is None:  # the client went away (cancelled) mid-request
                driver.abort(rid)
        body = "".join(text)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if kind == "text":
            choice["text"] = body
        else:
            choice["message"] = {"role": "assistant", "content": body}
        return JSONResponse(
            {
                "id": rid,
                "object": "text_completion" if kind == "text" else "chat.completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": _usage(len(ids), n_out, sub.cached),
            }
        )

    @app.exception_handler(ProtocolError)
    async def _protocol_error(_: Request, e: ProtocolError) -> JSONResponse:
        return _error(str(e), e.status, e.param)

    @app.get("/health")
    async def health() -> Response:
        if driver.dead:
            return _error(f"scheduler is not running: {driver.dead}", 503)
        return JSONResponse({"status": "ok", **driver.stats()})

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": "0.1.0"}

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
        req = await parse(request, CompletionRequest)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ProtocolError("batched prompts are not supported; send one prompt", "prompt")
            prompt = prompt[0]
        ids = tok.encode(prompt) if isinstance(prompt, str) else list(prompt)
        check_prompt(ids)
        return await run(ids, req, "text")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        req = await parse(request, ChatCompletionRequest)
        try:
            messages = [m.model_dump() for m in req.messages]
            ids = tok.encode_chat(messages, req.add_generation_prompt)
        except ChatTemplateError as e:
            raise ProtocolError(str(e), "messages") from e
        check_prompt(ids)
        return await run(ids, req, "chat")

    return app


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _stream(
    sub: Submission,
    kind: str,
    rid: str,
    created: int,
    model: str,
    prompt_len: int,
    include_usage: bool,
    driver: EngineDriver,
) -> AsyncIterator[bytes]:
    obj = "text_completion" if kind == "text" else "chat.completion.chunk"

    def chunk(text: str | None, reason: str | None, first: bool = False) -> dict[str, Any]:
        if kind == "text":
            choice: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None}
        else:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None}
        choice["finish_reason"] = reason
        return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}

    n_out = 0
    finished = False
    try:
        if kind == "chat":
            yield _sse(chunk("", None, first=True))
        while True:
            item = await sub.out.get()
            if isinstance(item, Exception):
                yield _sse(error_body(str(item), 400 if isinstance(item, ValueError) else 503))
                finished = True
                break
            assert isinstance(item, StepOutput)
            n_out += len(item.new_token_ids)
            sub.cached = item.cached_tokens
            if item.text_delta or item.finished:
                yield _sse(chunk(item.text_delta, item.finish_reason if item.finished else None))
            if item.finished:
                finished = True
                break
        if include_usage:
            yield _sse(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": _usage(prompt_len, n_out, sub.cached),
                }
            )
        yield b"data: [DONE]\n\n"
    finally:
        if not finished:  # the client disconnected: free its memory now
            driver.abort(rid)
