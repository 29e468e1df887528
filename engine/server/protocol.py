"""OpenAI request schemas, the fields this server refuses, and the translation of a request into
SamplingParams with 4xx-grade errors that name the field.

The schemas are what the server publishes in its OpenAPI document and what it accepts: unknown
fields are refused (as OpenAI itself does), and so are the OpenAI fields it has not built, unless
they carry the value that asks for nothing. Silently ignoring a field a client relies on (JSON
output, tools) would answer a different question than the one asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator

from engine.guide import Guide
from engine.prompt import PromptError, check_param_ids, fit_max_tokens
from engine.sampling_params import (
    BIAS_LIMIT,
    LOGPROBS_LIMIT,
    PENALTY_LIMIT,
    REPETITION_LIMIT,
    SEED_MAX,
    SEED_MIN,
    SamplingParams,
)

MAX_N = 16  # choices per request; each is its own request in the scheduler, sharing the prefix
MAX_STOPS = 4  # stop strings per request, as OpenAI allows


class ProtocolError(ValueError):
    """A request that is well-formed JSON but asks for something invalid: HTTP 400."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def json_object(body: bytes) -> dict[str, Any]:
    """A request body parsed as a JSON object; a ProtocolError (400) saying what it is not."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ProtocolError(f"request body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ProtocolError("request body must be a JSON object")
    return data


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What the served engine can take: the numbers a request is checked against."""

    max_context: int
    kv_tokens: int  # the whole KV pool
    vocab_size: int
    token_chars: int  # the most characters one token stands for (engine.prompt)


class _Strict(BaseModel):
    """Unknown fields refused, and types as the OpenAI API has them: an integer field takes an
    integer only (not "3", 1.0 or true), a boolean field true or false only; a number field
    takes an integer too, as JSON numbers go."""

    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False
    # vLLM's extension: with include_usage, every chunk carries its choice's usage so far
    continuous_usage_stats: bool = False


# a token id: the document says its upper bound too, the served vocabulary (openapi.publish)
TokenId = Annotated[int, Field(ge=0, json_schema_extra={"x-token-id": True})]
StopString = Annotated[str, Field(min_length=1)]
Penalty = Annotated[float, Field(ge=-PENALTY_LIMIT, le=PENALTY_LIMIT)]
_BIAS = {"type": "number", "minimum": -BIAS_LIMIT, "maximum": BIAS_LIMIT}
BiasMap = Annotated[
    dict[Annotated[str, Field(pattern=r"^[0-9]+$")], Annotated[float, Field(ge=-BIAS_LIMIT, le=BIAS_LIMIT)]],
    WithJsonSchema({"type": "object", "patternProperties": {"^[0-9]+$": _BIAS},
                    "additionalProperties": False}),
]  # fmt: skip
One = Field(json_schema_extra={"maxItems": 1})  # one prompt: the document says so, run() checks


class JsonSchemaFormat(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    # OpenAI's strict: an object takes no property its schema does not name
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's extension: the output matches a JSON schema, a regex, one of the choices or an
    EBNF grammar (exactly one of them)."""

    json_: dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


class _Common(_Strict):
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0)] | None = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] | None = 1.0
    top_k: Annotated[int, Field(ge=-1)] = -1
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] | None = None
    stop: str | Annotated[list[StopString], Field(max_length=MAX_STOPS)] | None = None
    stop_token_ids: list[TokenId] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = 1
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    presence_penalty: Penalty | None = 0.0
    frequency_penalty: Penalty | None = 0.0
    logit_bias: BiasMap | None = None  # token id (a JSON key, so a string) -> bias
    user: str | None = None
    # vLLM's sampling extensions
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None  # the last k; -1: context
    repetition_penalty: Annotated[float, Field(ge=1 / REPETITION_LIMIT, le=REPETITION_LIMIT)] = 1.0
    # vLLM's scheduling priority (the lower value waits less; --scheduling-policy priority)
    priority: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] = 0
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None

    def prompt_logprob_count(self) -> int | None:
        return None  # a chat has no prompt logprobs

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _k_tokens(cls, v: int | None) -> int | None:
        if v == 0:
            raise ValueError("must be -1 (the model's context) or an integer >= 1, got 0")
        return v

    def truncated(self, ids: list[int], max_context: int) -> list[int]:
        """The prompt's last ``truncate_prompt_tokens`` tokens (-1: as many as the context
        holds), as vLLM truncates; the whole prompt where it is within that."""
        k = self.truncate_prompt_tokens
        if k is None:
            return ids
        k = max_context if k == -1 else k
        return ids[-k:] if len(ids) > k else ids

    @field_validator("temperature", "top_p", "stream", "n", "presence_penalty",
                     "frequency_penalty", mode="before")  # fmt: skip
    @classmethod
    def _null_is_the_default(cls, v: Any, info: Any) -> Any:
        return cls.model_fields[info.field_name].default if v is None else v


class CompletionRequest(_Common):
    prompt: str | list[TokenId] | Annotated[list[str], One] | Annotated[list[list[TokenId]], One]
    echo: bool | None = False  # the prompt's text comes before the completion's
    add_special_tokens: bool = True  # vLLM's: the tokenizer's special tokens (BOS) added
    # each token's logprob and this many most likely tokens' (0: the token's only)
    logprobs: Annotated[int, Field(ge=0, le=LOGPROBS_LIMIT)] | None = None

    def logprob_count(self) -> int | None:
        return self.logprobs

    def prompt_logprob_count(self) -> int | None:
        """With echo, the prompt's tokens come with their logprobs too (how evaluation
        harnesses score a text's likelihood)."""
        return self.logprobs if self.echo else None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    add_generation_prompt: bool = True
    # vLLM's: the tokenizer's special tokens added on top of the template's (which has its own)
    add_special_tokens: bool = False
    logprobs: bool | None = False  # each content token's logprob
    top_logprobs: Annotated[int, Field(ge=0, le=LOGPROBS_LIMIT)] | None = None

    def logprob_count(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:
                raise ProtocolError("top_logprobs needs logprobs: true", "top_logprobs")
            return None
        return self.top_logprobs or 0


def _none(v: Any) -> bool:
    return v is None or v is False or v == [] or v == ""


# OpenAI fields this server has not built: each is ignored when it carries the value that asks
# for nothing, and refused otherwise (field -> (accepts, why not)).
_UNBUILT: dict[str, tuple[Any, str]] = {
    "tools": (_none, "(tool calling) are not supported by this server"),
    "tool_choice": (lambda v: v in (None, "none"), "is not supported: this server calls no tools"),
    "functions": (_none, "(function calling) are not supported by this server"),
    "function_call": (lambda v: v in (None, "none"), "is not supported: this server calls no functions"),
    "parallel_tool_calls": (lambda v: True, ""),  # without tools it asks for nothing
    "suffix": (_none, "(text insertion) is not supported by this server"),
    # a chat's field; a completion's logprobs (an integer) says how many
    "top_logprobs": (lambda v: v is None or (v == 0 and v is not False),
                     "is a chat field: a completion's logprobs (an integer) says how many"),
    "modalities": (lambda v: v is None or v == ["text"], 'is not supported: this server writes text only (["text"])'),
    "audio": (lambda v: v is None, "output is not supported by this server"),
    "prediction": (lambda v: v is None, "(predicted outputs) is not supported by this server"),
}  # fmt: skip
# fields that change nothing a client receives, accepted and ignored
_INERT = frozenset({"metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"})
# the integer and boolean fields of those two groups, typed as strictly as the built ones
_INT, _BOOL = ("integer", int), ("boolean", bool)
_SCALARS = {"best_of": _INT, "top_logprobs": _INT, "parallel_tool_calls": _BOOL, "store": _BOOL}


def _check_scalars(data: dict[str, Any], model: type[BaseModel]) -> None:
    for key, value in data.items():
        typed = None if key in model.model_fields else _SCALARS.get(key)
        if typed is not None and value is not None and type(value) is not typed[1]:
            raise ProtocolError(
                f"{key}: Input should be a valid {typed[0]} (got {shown(value)})", key
            )


def refuse_unbuilt(data: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """The body without the fields that ask for nothing; a ProtocolError naming the first field
    that asks for something this server does not do, or that it does not know."""
    _check_scalars(data, model)
    n = data.get("n") or 1
    best_of = data.get("best_of")
    if best_of not in (None, 1, n) or isinstance(best_of, bool):
        raise ProtocolError(
            f"best_of must be 1 or equal to n ({n}), got {best_of!r}: this server does not "
            "generate candidates to rank",
            "best_of",
        )
    kept = {}
    for key, value in data.items():
        if key in model.model_fields:
            kept[key] = value
        elif key in _UNBUILT:
            accepts, why = _UNBUILT[key]
            if not accepts(value):
                raise ProtocolError(f"{key} {why}", key)
        elif key not in _INERT and key != "best_of":
            raise ProtocolError(f"{key} is not a supported request field", key)
    return kept


def validation_error(model: type[BaseModel], e: ValidationError) -> ProtocolError:
    """A pydantic error as the client should read it: the field, the rule, the value sent."""
    errors = e.errors()
    # the deepest fault, and one about a value over one about another union branch's type
    first = max(errors, key=lambda x: (len(x["loc"]), not x["type"].endswith("_type")))
    loc = first["loc"]
    if first["type"] == "extra_forbidden":  # the unknown field is the location's last part
        param = ".".join(p for p in (field_path(model, loc[:-1]) if loc[:-1] else "", loc[-1]) if p)
        return ProtocolError(f"{param} is not supported by this server", param)
    param = field_path(model, loc)
    message = f"{param}: {first['msg']}"
    value = first.get("input")
    if first["type"] in _TYPE_ERRORS or (isinstance(value, (int, float, str)) and "ctx" in first):
        message += f" (got {shown(value)})"  # what came, whole or described, never cut
    return ProtocolError(message, param)


_TYPE_ERRORS = frozenset({"int_type", "bool_type", "float_type", "string_type"})


def shown(value: Any) -> str:
    """A request's value as a message shows it: JSON's words for its literals and containers."""
    if value is None or isinstance(value, bool):
        return orjson.dumps(value).decode()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"a string of {len(value)} characters"
    return "an array" if isinstance(value, list) else "an object"


def sampling_params(
    req: _Common, prompt_len: int, limits: ModelLimits, default_max: int, guide: Guide | None = None
) -> SamplingParams:
    """Validate and translate; every failure names the field, as OpenAI's errors do. Whether
    the request can ever fit (prompt + max_tokens against the context and the pool) is decided
    here, before anything is submitted."""
    asked = getattr(req, "max_completion_tokens", None) or req.max_tokens
    try:
        max_tokens = fit_max_tokens(
            prompt_len, asked, max_context=limits.max_context, kv_tokens=limits.kv_tokens,
            default=default_max,
        )  # fmt: skip
    except PromptError as e:
        raise ProtocolError(str(e), e.param) from e
    bias = {int(t): b for t, b in (req.logit_bias or {}).items()} or None
    try:
        check_param_ids(req.stop_token_ids, bias, vocab_size=limits.vocab_size)
    except PromptError as e:
        raise ProtocolError(str(e), e.param) from e
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
            top_k=req.top_k, min_p=req.min_p, seed=req.seed, stop=req.stop or None,
            stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens, presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty, logit_bias=bias,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            repetition_penalty=req.repetition_penalty, guide=guide, logprobs=req.logprob_count(),
            prompt_logprobs=req.prompt_logprob_count(), priority=req.priority,
        )  # fmt: skip
    except ValueError as e:
        raise ProtocolError(str(e), str(e).split(" ", 1)[0]) from e


def field_path(model: type[BaseModel], loc: tuple) -> str:
    """The request field a validation error is about (``messages.0.content.0.type``), without
    the union-branch tags and dict keys pydantic puts in its location (``prompt.str``)."""
    parts: list[str] = []
    cur: Any = model
    for x in loc:
        if isinstance(x, int):
            parts.append(str(x))
            continue
        fields = getattr(cur, "model_fields", None)
        if fields and x in fields:
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


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               408: "timeout_error", 413: "invalid_request_error", 429: "rate_limit_error",
               504: "timeout_error"}  # fmt: skip


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object, the one shape of every error this server answers."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
