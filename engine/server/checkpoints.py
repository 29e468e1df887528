"""Conversation checkpoints over HTTP: ``POST /v1/checkpoints`` with ``{"messages": [...]}`` (a
chat, rendered without a generation prompt, so the next turn's prompt begins with it) or
``{"prompt": "..." | [ids]}``, and optionally ``"id"``: the prompt runs (what is cached is not
computed again), its pages are written to the durable store and pinned; the answer is
``{"id", "tokens", "pinned_bytes", "shared_bytes", ...}``. ``GET /v1/checkpoints`` lists them
with the store's numbers (``used``, ``pinned``, ``reclaimable``: allocated bytes);
``DELETE /v1/checkpoints/{id}`` unpins one. A checkpoint is ``complete`` when its manifest is
written and no page it pins is ``missing``. Errors: 400 (a malformed body; no store), 404 (no
such checkpoint), 409 (over the pin budget: ``want``, ``held``, ``budget``, ``overshoot`` beside
the error; or the id exists), 500 (its files could not be removed), 503 (the scheduler is
stopping), 507 (no room in the store).
The work is the scheduler's (``engine/tiers/checkpoints.py``); this side only tokenizes and asks.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from engine.guided.tools import history
from engine.model.chat import ChatTemplateError, normalize_messages
from engine.request.guide import GuideError
from engine.request.messages import CheckpointOp
from engine.server import openapi
from engine.server.errors import ProtocolError, error_body
from engine.server.limits import read_json
from engine.server.protocol import ChatMessage, TokenId, _Strict
from engine.server.tokenize import validated

if TYPE_CHECKING:
    from engine.server.service import CompletionService


class CheckpointCreate(_Strict):
    model: str | None = None
    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    prompt: str | list[TokenId] | None = None


BODIES = (CheckpointCreate,)


async def _tokens(service: CompletionService, req: CheckpointCreate) -> list[int]:
    """The checkpoint's prompt in the model's tokens; a ProtocolError naming what is wrong."""
    tok, limits = service.driver.tokenizer, service.limits
    if (req.messages is None) == (req.prompt is None):
        raise ProtocolError("give exactly one of messages and prompt", "messages")
    if req.messages is not None:
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        service.check_chars(sum(len(str(m.get("content") or "")) for m in messages), "messages")
        try:
            messages = history(normalize_messages(messages), tok.knows_tools)
            return await service.off_loop(tok.encode_chat, messages, False, False)
        except ChatTemplateError as e:
            raise ProtocolError(str(e), "messages") from e
        except GuideError as e:
            raise ProtocolError(str(e), e.param) from e
    if isinstance(req.prompt, str):
        service.check_chars(len(req.prompt), "prompt")
        return await service.off_loop(tok.encode, req.prompt, True)
    ids = list(req.prompt or [])
    if (bad := next((t for t in ids if t >= limits.vocab_size), None)) is not None:
        raise ProtocolError(f"prompt: token id {bad} is outside the vocabulary", "prompt")
    return ids


async def ask(service: CompletionService, op: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    """Have the scheduler do checkpoint ``op``: its status and body (a stopping or gone
    scheduler: 503). The one way in for every route that checkpoints (``/v1/responses`` too)."""
    try:
        fut = service.driver.ask(lambda ticket: CheckpointOp(op=op, ticket=ticket, **kw))
        status, body = await asyncio.wrap_future(fut)
    except RuntimeError as e:  # the scheduler is stopping or gone
        return 503, {"message": str(e)}
    return status, body


async def _ask(service: CompletionService, op: str, **kw: Any) -> Response:
    status, body = await ask(service, op, **kw)
    if status == 200:
        return JSONResponse(body)
    message = str(body.pop("message", "checkpoint refused"))
    extra = {"checkpoint": body} if body else {}
    return JSONResponse({**error_body(message, status), **extra}, status_code=status)


async def create(service: CompletionService, request: Request) -> Response:
    data = await read_json(request, service.http)
    req = validated(data, CheckpointCreate, service.served_name)
    ids = await _tokens(service, req)
    if not ids:
        raise ProtocolError("the prompt is empty", "prompt")
    return await _ask(service, "create", tokens=ids, id=req.id)


def mount(app: FastAPI, service: CompletionService) -> None:
    async def _create(request: Request) -> Response:
        return await create(service, request)

    async def _list() -> Response:
        return await _ask(service, "list")

    async def _delete(cid: str) -> Response:
        return await _ask(service, "delete", id=cid)

    app.post("/v1/checkpoints", **openapi.body(CheckpointCreate))(_create)
    app.get("/v1/checkpoints")(_list)
    app.delete("/v1/checkpoints/{cid}")(_delete)
