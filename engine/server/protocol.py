"""OpenAI request schemas, and their translation into SamplingParams with 4xx-grade errors."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field

from engine.sampling_params import SamplingParams

MAX_N = 16  # choices per request; each is its own request in the scheduler, sharing the prefix


class ProtocolError(ValueError):
    """A request that is well-formed JSON but asks for something invalid: HTTP 400."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields are ignored, as vLLM does

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: Any = None
    user: str | None = None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True
    top_logprobs: int | None = None


def sampling_params(
    req: _Common, prompt_len: int, max_context: int, default_max: int
) -> SamplingParams:
    """Validate and translate; every failure names the field, as OpenAI's errors do."""
    if not 1 <= req.n <= MAX_N:
        raise ProtocolError(f"n must be between 1 and {MAX_N}, got {req.n}", "n")
    if req.logprobs not in (None, False) or getattr(req, "top_logprobs", None):
        raise ProtocolError("logprobs are not supported by this server", "logprobs")
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
    room = max_context - prompt_len
    if max_tokens is None:
        max_tokens = min(default_max, room)
    elif max_tokens < 1:
        raise ProtocolError(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    elif max_tokens > room:
        raise ProtocolError(
            f"max_tokens {max_tokens} + prompt {prompt_len} tokens exceed the context limit "
            f"{max_context}",
            "max_tokens",
        )
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=req.seed,
            stop=req.stop or None,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
        )
    except ValueError as e:
        raise ProtocolError(str(e), str(e).split(" ", 1)[0]) from e


def field_path(model: type[BaseModel], loc: tuple) -> str:
    """The request field a validation error is about (``messages.0.content``), without the
    union-branch tags pydantic appends to its location (``prompt.str``)."""
    parts: list[str] = []
    cur: Any = model
    for x in loc:
        if isinstance(x, int):
            parts.append(str(x))
            continue
        fields = getattr(cur, "model_fields", None)
        if not fields or x not in fields:
            break
        parts.append(x)
        cur = _inner_model(fields[x].annotation)
    return ".".join(parts) or ".".join(str(x) for x in loc)


def _inner_model(annotation: Any) -> Any:
    """The pydantic model inside an annotation such as ``list[ChatMessage] | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
    return {
        "error": {
            "message": message,
            "type": kind.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": status,
        }
    }
