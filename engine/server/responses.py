"""OpenAI response shapes: a whole completion, its server-sent-event stream, an error body.

``kind`` is ``"text"`` (/v1/completions) or ``"chat"`` (/v1/chat/completions); ``meta`` is what
every body and chunk of one response repeats (``id``, ``created``, ``model``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi.responses import JSONResponse

from engine.server.job import Job, JobFailed
from engine.server.protocol import error_body


def error_response(message: str, status: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status)


def completion_body(
    job: Job, kind: str, meta: dict[str, Any], texts: list[list[str]]
) -> dict[str, Any]:
    """The non-streaming body, from each choice's text deltas and the job's finish reasons."""
    choices = []
    for i, (parts, reason) in enumerate(zip(texts, job.reasons)):
        choice: dict[str, Any] = {"index": i, "finish_reason": reason, "logprobs": None}
        if kind == "text":
            choice["text"] = "".join(parts)
        else:
            choice["message"] = {"role": "assistant", "content": "".join(parts)}
        choices.append(choice)
    obj = "text_completion" if kind == "text" else "chat.completion"
    return {**meta, "object": obj, "choices": choices, "usage": job.usage()}


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chunk(
    kind: str,
    meta: dict[str, Any],
    i: int,
    text: str | None,
    reason: str | None,
    first: bool = False,
) -> bytes:
    """One choice's delta as an SSE event; a chat stream's first chunk names the role."""
    if kind == "text":
        choice: dict[str, Any] = {"index": i, "text": text or "", "logprobs": None}
    else:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": i, "delta": delta, "logprobs": None}
    choice["finish_reason"] = reason
    return sse({**meta, "object": _stream_object(kind), "choices": [choice]})


def _stream_object(kind: str) -> str:
    return "text_completion" if kind == "text" else "chat.completion.chunk"


async def stream(
    job: Job, kind: str, meta: dict[str, Any], include_usage: bool
) -> AsyncIterator[bytes]:
    """The SSE body: a chunk per delta, an error event if the job fails midway, the usage
    (when asked) and ``[DONE]``. Closing it early aborts what is still running."""
    status, error = 499, "the client went away"
    try:
        if kind == "chat":
            for i in range(len(job.subs)):
                yield _chunk(kind, meta, i, "", None, first=True)
        try:
            async for i, item in job.events():
                if item.text_delta or item.finished:
                    reason = item.finish_reason if item.finished else None
                    yield _chunk(kind, meta, i, item.text_delta, reason)
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
