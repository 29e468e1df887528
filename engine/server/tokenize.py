"""vLLM's tokenizer routes, which evaluation clients use to tokenize as the server does:
``POST /tokenize`` (a prompt, or a chat's messages rendered by the model's template),
``POST /detokenize`` (token ids back to text) and ``GET /tokenizer_info`` (the special tokens and
the chat template). lm-eval's ``local-completions`` finds them on its own and then counts its
contexts in the served model's own tokens, with no copy of the tokenizer on the client's side.

The answers have vLLM's shapes: ``{"count", "max_model_len", "tokens", "token_strs"}``,
``{"prompt"}``, and the tokenizer's configuration. A prompt longer than the context is still
tokenized (the count is what a client asks for); one too long to be worth tokenizing is refused
on its characters first, as the completion routes refuse it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field, ValidationError

from engine.server import openapi
from engine.server.errors import ProtocolError, validation_error
from engine.server.limits import read_json
from engine.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    TokenId,
    ToolDef,
    _Strict,
    check_model,
)
from engine.server.service import CompletionService, chat_chars


class TokenizePrompt(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True  # as a completion's prompt is tokenized
    return_token_strs: bool = False  # each token's own string besides its id


class TokenizeChat(_Strict):
    """A chat's messages, rendered as a chat completion with the same fields renders them."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # the template writes its own, as for a chat completion
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ToolDef] | None = None  # rendered as the chat renders them (tool_choice auto)
    return_token_strs: bool = False


class Detokenize(_Strict):
    model: str | None = None
    tokens: list[TokenId]


BODIES = (TokenizePrompt, TokenizeChat, Detokenize)  # the bodies the document declares


def validated(data: dict[str, Any], model: type[BaseModel], served: str) -> Any:
    try:
        req = model.model_validate(data)
    except ValidationError as e:
        raise validation_error(model, e) from e
    check_model(req.model, served)
    return req


async def tokenize(service: CompletionService, request: Request) -> dict[str, Any]:
    data = await read_json(request, service.http)
    tok = service.driver.tokenizer
    if "messages" in data:
        req = validated(data, TokenizeChat, service.served_name)
        # the chat completion these fields make, its prompt rendered the one way chats are
        fields = req.model_dump(exclude={"model", "return_token_strs"}, exclude_unset=True)
        chat = ChatCompletionRequest.model_validate(fields)
        service.check_chars(chat_chars(chat), "messages")
        _, ids = await service.off_loop(service.chat_prompt, chat)
    else:
        req = validated(data, TokenizePrompt, service.served_name)
        service.check_chars(len(req.prompt), "prompt")
        ids = await service.off_loop(tok.encode, req.prompt, req.add_special_tokens)
    strs = [tok.token_text(i) for i in ids] if req.return_token_strs else None
    return {
        "count": len(ids),
        "max_model_len": service.limits.max_context,
        "tokens": ids,
        "token_strs": strs,
    }


async def detokenize(service: CompletionService, request: Request) -> dict[str, Any]:
    req = validated(await read_json(request, service.http), Detokenize, service.served_name)
    vocab = service.limits.vocab_size
    if (bad := next((t for t in req.tokens if t >= vocab), None)) is not None:
        raise ProtocolError(
            f"tokens: token id {bad} is outside the vocabulary (0..{vocab - 1})", "tokens"
        )
    # special tokens kept, as vLLM's detokenize keeps them: the text of exactly those ids
    return {"prompt": service.driver.tokenizer.decode(req.tokens, skip_special_tokens=False)}


def tokenizer_info(service: CompletionService) -> dict[str, Any]:
    """The tokenizer's configuration as Hugging Face names it: the class that reads the same
    tokenizer.json, its special tokens, whether a prompt starts with BOS, the chat template."""
    tok = service.driver.tokenizer
    text = lambda tid: tok.token_text(tid) if tid is not None else None  # noqa: E731
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(tok.bos_id),
        "eos_token": text(tok.eos_id),
        "pad_token": None,
        "add_bos_token": tok.add_bos,
        "chat_template": tok.chat_template,
        "model_max_length": service.limits.max_context,
        "vocab_size": service.limits.vocab_size,
    }


def mount(app: FastAPI, service: CompletionService) -> None:
    """The three routes on ``app``; the first two declare their bodies in the document."""

    async def _tokenize(request: Request) -> dict[str, Any]:
        return await tokenize(service, request)

    async def _detokenize(request: Request) -> dict[str, Any]:
        return await detokenize(service, request)

    async def _info() -> dict[str, Any]:
        return tokenizer_info(service)

    app.post("/tokenize", **openapi.body(TokenizePrompt, TokenizeChat))(_tokenize)
    app.post("/detokenize", **openapi.body(Detokenize))(_detokenize)
    app.get("/tokenizer_info")(_info)
