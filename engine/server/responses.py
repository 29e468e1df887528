"""OpenAI response shapes: a whole completion, its server-sent-event stream, and the error
object every error of every route answers with (the framework's 404 and 405 included).

``kind`` is ``"text"`` (/v1/completions) or ``"chat"`` (/v1/chat/completions); ``meta`` is what
every body and chunk of one response repeats (``id``, ``created``, ``model``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from engine.guided.tool_parsers import GenericParser, HermesParser, merged, parser_for
from engine.guided.tools import ToolPlan
from engine.request.messages import StepOutput
from engine.server.errors import ProtocolError, error_body
from engine.server.job import Job, JobFailed
from engine.server.limits import ClientGone, went_away
from engine.server.logprobs import LogprobsWriter

# answers after which the connection is closed: the client may still be sending its body
_CLOSE = frozenset({408, 413, 429})


def error_response(
    message: str, status: int, param: str | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    extra = {"connection": "close"} if status in _CLOSE else {}
    return JSONResponse(
        error_body(message, status, param), status_code=status, headers={**extra, **(headers or {})}
    )


def install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape; a client that left is one line on stderr."""

    @app.exception_handler(ProtocolError)
    async def _protocol(_: Request, e: ProtocolError) -> Response:
        # a 415 says which encoding is accepted (RFC 9110 12.5.3)
        headers = {"accept-encoding": "identity"} if e.status == 415 else {}
        return error_response(str(e), e.status, e.param, {**e.headers, **headers})

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException) -> Response:
        where = f"{request.method} {request.url.path}"
        message = {
            404: f"{where}: no such route (the routes are in /openapi.json)",
            405: f"{where}: method not allowed; allowed: {(e.headers or {}).get('Allow')}",
        }.get(e.status_code, f"{where}: {e.detail}")
        return error_response(message, e.status_code, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> Response:
        first = e.errors()[0]
        param = ".".join(str(x) for x in first["loc"][1:]) or None
        return error_response(f"{param}: {first['msg']}", 400, param)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, e: ClientGone) -> Response:
        went_away(request, str(e))
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(Exception)
    async def _crash(_: Request, e: Exception) -> Response:
        # a bug: the traceback is still printed; the client gets the error object
        return error_response(f"internal error: {type(e).__name__}", 500)


def completion_body(
    job: Job,
    kind: str,
    meta: dict[str, Any],
    texts: list[list[str]],
    logprobs: list[dict[str, Any]] | None = None,
    tools: ToolPlan | None = None,
) -> dict[str, Any]:
    """The non-streaming body, from each choice's text deltas and the job's finish reasons
    (``logprobs``: each choice's, when asked; ``tools``: the output read for calls)."""
    choices = []
    for i, (parts, reason) in enumerate(zip(texts, job.reasons)):
        lp = logprobs[i] if logprobs is not None else None
        text = "".join(parts)
        choice: dict[str, Any] = {"index": i, "finish_reason": reason, "logprobs": lp}
        if kind == "text":
            choice["text"] = text
        elif tools is not None and tools.active:
            parser = parser_for(tools.format)
            deltas = parser.feed(text)
            more, choice["finish_reason"] = parser.finish(reason)
            job.answered(i, choice["finish_reason"])
            content, calls = merged(deltas + more)
            choice["message"] = {"role": "assistant", "content": content}
            if calls:
                choice["message"]["tool_calls"] = calls
        else:
            choice["message"] = {"role": "assistant", "content": text}
        choices.append(choice)
    obj = "text_completion" if kind == "text" else "chat.completion"
    return {**meta, "object": obj, "choices": choices, "usage": job.usage()}


# Characters JSON leaves raw that ``str.splitlines`` (so httpx's ``iter_lines``) ends a line at:
# escaped, an event stays one line to those clients too. Their UTF-8 forms occur only as
# themselves, so a byte replacement is exact.
_LINE_BREAKERS = (
    (b"\xc2\x85", b"\\u0085"),
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
)


def sse(obj: Any) -> bytes:
    data = orjson.dumps(obj)
    for raw, escaped in _LINE_BREAKERS:
        if raw in data:
            data = data.replace(raw, escaped)
    return b"data: " + data + b"\n\n"


def _chunk(
    kind: str,
    meta: dict[str, Any],
    i: int,
    delta: dict[str, Any] | None,
    reason: str | None,
    first: bool = False,
    usage: dict[str, int] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> bytes:
    """One choice's delta as an SSE event (``delta``: OpenAI's chat delta, its ``content`` the
    text of a completion's); a chat stream's first chunk names the role. ``usage``: the
    choice's so far, where the client asked for it in every chunk; ``logprobs``: the delta's
    tokens', where asked."""
    if kind == "text":
        text = (delta or {}).get("content") or ""
        choice: dict[str, Any] = {"index": i, "text": text, "logprobs": logprobs}
    else:
        out = {"role": "assistant", **(delta or {})} if first else dict(delta or {})
        choice = {"index": i, "delta": out, "logprobs": logprobs}
    choice["finish_reason"] = reason
    event = {**meta, "object": _stream_object(kind), "choices": [choice]}
    if usage is not None:
        event["usage"] = usage
    return sse(event)


def step_deltas(
    item: StepOutput, parser: GenericParser | HermesParser | None, logprobs: bool
) -> tuple[list[dict[str, Any] | None], str | None]:
    """One output's chunks' deltas (``parser``: read for tool calls) and its finish reason; a
    delta of None: a chunk without text (the ending, or the step's logprobs)."""
    reason = item.finish_reason if item.finished else None
    some = item.finished or (logprobs and item.new_token_ids)
    if parser is None:
        return ([{"content": item.text_delta}] if item.text_delta or some else []), reason
    deltas: list[dict[str, Any] | None] = [*parser.feed(item.text_delta)]
    if item.finished:
        more, reason = parser.finish(reason)
        deltas += more
    return (deltas or ([None] if some else [])), reason


def _so_far(job: Job, done: int) -> dict[str, int]:
    """A choice's usage after ``done`` of its tokens (vLLM's continuous usage stats)."""
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": done,
        "total_tokens": job.prompt_tokens + done,
    }


def _stream_object(kind: str) -> str:
    return "text_completion" if kind == "text" else "chat.completion.chunk"


async def stream(
    job: Job,
    kind: str,
    meta: dict[str, Any],
    include_usage: bool,
    echo: str = "",
    continuous: bool = False,
    logprobs: LogprobsWriter | None = None,
    tools: ToolPlan | None = None,
) -> AsyncIterator[bytes]:
    """The SSE body: the echoed prompt (``echo``), a chunk per delta, an error event if the job
    fails midway (the deadline included), the usage (when asked) and ``[DONE]``; ``continuous``
    (with ``include_usage``): each chunk with its choice's usage so far; ``logprobs``: each
    chunk with its tokens' (a chunk for every step then, text or not); ``tools``: the output
    read for calls as it streams (tool-call deltas). Closing it early aborts what is still
    running."""
    status, error = 499, "the client went away"
    done = [0] * len(job.subs)  # each choice's tokens so far, as its chunks tell them
    every = include_usage and continuous
    reading = tools is not None and tools.active
    parsers = [parser_for(tools.format) for _ in job.subs] if reading else None  # type: ignore[union-attr]
    try:
        # the echo waits for the prompt's logprobs, when they were asked for
        held = logprobs is not None and logprobs.prompt is not None
        if kind == "chat" or (echo and not held):
            for i in range(len(job.subs)):
                first = {"content": echo} if kind == "text" or not reading else {}
                yield _chunk(kind, meta, i, first, None, True, _so_far(job, 0) if every else None)
        try:
            async for i, item in job.events():
                done[i] += len(item.new_token_ids)
                if held and item.prompt_logprobs is not None:
                    lp = logprobs.of(i, [], item.prompt_logprobs)  # type: ignore[union-attr]
                    yield _chunk(kind, meta, i, {"content": echo}, None, True, logprobs=lp)
                lp = None if logprobs is None else logprobs.of(i, item.logprobs or [])
                deltas, reason = step_deltas(item, parsers[i] if parsers else None, bool(lp))
                if parsers is not None and item.finished:
                    job.answered(i, reason)
                usage = _so_far(job, done[i]) if every else None
                for k, delta in enumerate(deltas):
                    last = k == len(deltas) - 1
                    yield _chunk(
                        kind,
                        meta,
                        i,
                        delta,
                        reason if last else None,
                        usage=usage,
                        logprobs=lp if k == 0 else None,
                    )
        except JobFailed as e:
            status, error = e.status, str(e)
            yield sse(error_body(str(e), e.status))
        else:
            status, error = 200, None
            if include_usage:
                usage = {
                    **meta,
                    "object": _stream_object(kind),
                    "choices": [],
                    "usage": job.usage(),
                }
                yield sse(usage)
        yield b"data: [DONE]\n\n"
    finally:
        job.close()  # a client that disconnected: its requests abort and their memory is freed
        job.end_span(status, error)
