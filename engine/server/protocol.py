"""OpenAI request schemas, the fields this server refuses, and the translation of a request into
SamplingParams (with the ``Guide`` its ``response_format``, ``structured_outputs`` or tools ask
for) with 4xx-grade errors that name the field.

The schemas are what the server publishes in its OpenAPI document and what it accepts: unknown
fields are refused (as OpenAI itself does), and so are the OpenAI fields it has not built, unless
they carry the value that asks for nothing. Silently ignoring a field a client relies on (JSON
output, tools) would answer a different question than the one asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from engine.guided.tools import ToolPlan
from engine.model.chat import RESERVED, ChatRender
from engine.request.guide import Guide, GuideError, choice_guide, json_schema_guide, text_guide
from engine.request.prompt import PromptError, check_param_ids, fit_max_tokens
from engine.request.sampling_params import (
    BIAS_LIMIT,
    LOGPROBS_LIMIT,
    PENALTY_LIMIT,
    REPETITION_LIMIT,
    SEED_MAX,
    SEED_MIN,
    SamplingParams,
)
from engine.server.errors import ProtocolError, shown

MAX_N = 16  # choices per request; each is its own request in the scheduler, sharing the prefix
MAX_STOPS = 4  # stop strings per request, as OpenAI allows
ID_DIGITS = 20  # more than any vocabulary's token id has (2**64 has 20)


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What the served engine can take: the numbers a request is checked against."""

    max_context: int
    kv_tokens: int  # the whole KV pool
    vocab_size: int
    token_chars: int  # the most characters one token stands for (engine.request.prompt)


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
    dict[
        Annotated[str, Field(pattern=r"^[0-9]+$")],
        Annotated[float, Field(ge=-BIAS_LIMIT, le=BIAS_LIMIT)],
    ],
    WithJsonSchema(
        {"type": "object", "patternProperties": {"^[0-9]+$": _BIAS}, "additionalProperties": False}
    ),
]
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
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None  # the last k; -1: context
    repetition_penalty: Annotated[float, Field(ge=1 / REPETITION_LIMIT, le=REPETITION_LIMIT)] = 1.0
    # vLLM's scheduling priority (the lower value waits less; --scheduling-policy priority)
    priority: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] = 0
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's: logprobs' tokens written as "token_id:N" (N the token's id), not as their text
    return_tokens_as_token_ids: bool = False
    # vLLM's: each prompt token's logprob after the first, with this many most likely tokens'
    prompt_logprobs: Annotated[int, Field(ge=0, le=LOGPROBS_LIMIT)] | None = None

    def prompt_logprob_count(self) -> int | None:
        """How many most likely tokens each prompt token's logprob comes with (None: the
        prompt is not scored). A stream writes none, as vLLM's: more than 0 is refused there."""
        k = self.prompt_logprobs
        if k and self.stream:
            raise ProtocolError(
                "prompt_logprobs are not available with stream: true (0 asks for nothing there)",
                "prompt_logprobs",
            )
        return None if self.stream else k

    def echo_scored(self) -> bool:
        """Whether the prompt's logprobs lead the answer's own (a completion's echo)."""
        return False

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

    @field_validator(
        "temperature",
        "top_p",
        "stream",
        "n",
        "presence_penalty",
        "frequency_penalty",
        mode="before",
    )
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

    def echo_scored(self) -> bool:
        """With echo, the prompt's tokens come with their logprobs too (how evaluation
        harnesses score a text's likelihood)."""
        return bool(self.echo) and self.logprobs is not None

    def prompt_logprob_count(self) -> int | None:
        """As many most likely tokens as the echo's logprobs and ``prompt_logprobs`` ask, the
        more of the two (each is written with its own)."""
        echo = self.logprobs if self.echo_scored() else None
        asked = [k for k in (super().prompt_logprob_count(), echo) if k is not None]
        return max(asked) if asked else None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class FunctionDef(_Strict):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments (none: no arguments)
    strict: bool | None = None  # the arguments are always held to the schema


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class CalledFunction(_Strict):
    name: str
    arguments: str  # a JSON object, as a string


class ToolCall(_Strict):
    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # the call a tool message answers
    refusal: None = None  # what an OpenAI client sends back of an answer it got

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls belong to an assistant message")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message, and only a tool message, has a tool_call_id")
        return self


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    add_generation_prompt: bool = True
    # vLLM's: the last message is continued, its turn left open (add_generation_prompt false)
    continue_final_message: bool = False
    # vLLM's: more variables for the chat template (none of the template's own)
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: a last assistant message's text comes first in the answer
    echo: bool = False
    # vLLM's: the tokenizer's special tokens added on top of the template's (which has its own)
    add_special_tokens: bool = False
    logprobs: bool | None = False  # each content token's logprob
    top_logprobs: Annotated[int, Field(ge=0, le=LOGPROBS_LIMIT)] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True  # false: one call an answer at most

    def render(self) -> tuple[bool, ChatRender]:
        """``add_generation_prompt`` and how the template renders the chat besides it; a
        ProtocolError naming a conflict (as vLLM refuses it) or a variable the template owns."""
        if self.continue_final_message and self.add_generation_prompt:
            if "add_generation_prompt" in self.model_fields_set:
                raise ProtocolError(
                    "continue_final_message and add_generation_prompt cannot both be true: "
                    "a continued last message opens no new turn",
                    "continue_final_message",
                )
        for name in RESERVED:
            if name in (self.chat_template_kwargs or {}):
                raise ProtocolError(
                    f"chat_template_kwargs.{name}: {name!r} is the chat template's own "
                    "variable, set by the request itself",
                    f"chat_template_kwargs.{name}",
                )
        opened = self.add_generation_prompt and not self.continue_final_message
        return opened, ChatRender(self.continue_final_message, self.chat_template_kwargs)

    def echoed(self) -> str:
        """What ``echo`` puts first in each choice's answer: the last message's text when it is
        the assistant's (the answer's own role), else nothing."""
        last = self.messages[-1]
        if not self.echo or last.role != "assistant":
            return ""
        content = last.content or ""
        return content if isinstance(content, str) else "".join(p.text for p in content)

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
    "tools": (_none, "are a chat field: send them to /v1/chat/completions"),
    "tool_choice": (lambda v: v in (None, "none"), "is a chat field: send it to /v1/chat/completions"),
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


def bias_by_id(logit_bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """``logit_bias`` by token id. A key of more digits than any vocabulary's id has is refused
    by its length before ``int`` reads it: Python reads at most 4,300 digits into an int, a
    ValueError past them (an id is checked against the vocabulary with ``stop_token_ids``)."""
    out = {}
    for key, bias in (logit_bias or {}).items():
        digits = key.lstrip("0") or "0"  # zeros in front spell the same id
        if len(digits) > ID_DIGITS:
            raise ProtocolError(
                f"logit_bias: a key of {len(key)} digits is not a token id of the vocabulary "
                f"(0..{vocab_size - 1}); each key is a token id",
                "logit_bias",
            )
        out[int(digits)] = bias
    return out or None


def sampling_params(
    req: _Common, prompt_len: int, limits: ModelLimits, default_max: int, guide: Guide | None = None
) -> SamplingParams:
    """Validate and translate; every failure names the field, as OpenAI's errors do. Whether
    the request can ever fit (prompt + max_tokens against the context and the pool) is decided
    here, before anything is submitted."""
    asked = getattr(req, "max_completion_tokens", None) or req.max_tokens
    try:
        max_tokens = fit_max_tokens(
            prompt_len,
            asked,
            max_context=limits.max_context,
            kv_tokens=limits.kv_tokens,
            default=default_max,
        )
    except PromptError as e:
        raise ProtocolError(str(e), e.param) from e
    bias = bias_by_id(req.logit_bias, limits.vocab_size)
    try:
        check_param_ids(req.stop_token_ids, bias, vocab_size=limits.vocab_size)
    except PromptError as e:
        raise ProtocolError(str(e), e.param) from e
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
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            logit_bias=bias,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            repetition_penalty=req.repetition_penalty,
            guide=guide,
            logprobs=req.logprob_count(),
            prompt_logprobs=req.prompt_logprob_count(),
            priority=req.priority,
        )
    except ValueError as e:
        raise ProtocolError(str(e), str(e).split(" ", 1)[0]) from e


def check_model(name: str | None, served_model_name: str) -> None:
    """A request naming a model this server does not serve is a 404 naming ``model``."""
    if name not in (None, served_model_name):
        raise ProtocolError(
            f"model {name!r} does not exist; this server serves {served_model_name!r}",
            "model",
            404,
        )


def guide_of(
    fmt: ResponseFormat | None, vllm: StructuredOutputs | None, tools: ToolPlan | None = None
) -> tuple[Guide | None, str]:
    """What a request's ``response_format``, ``structured_outputs`` or tools ask the output to
    match, checked (a ProtocolError naming the place in the schema that cannot be honoured),
    and the field that asked. A chat's tools plan holds its answer format already
    (``answer_guide``): calls, the answer, or either, as its ``tool_choice`` says."""
    field = "structured_outputs" if vllm is not None else "response_format"
    if tools is not None:
        return tools.guide, "tools" if tools.active else field
    return answer_guide(fmt, vllm), field


def answer_guide(fmt: ResponseFormat | None, vllm: StructuredOutputs | None) -> Guide | None:
    """The format ``response_format`` or ``structured_outputs`` asks of the answer (None:
    free text), checked; a ProtocolError naming the field that cannot be honoured."""
    if fmt is not None and fmt.type != "text" and vllm is not None:
        raise ProtocolError(
            "response_format and structured_outputs both constrain the output: send one",
            "structured_outputs",
        )
    try:
        if vllm is not None:
            return _structured(vllm)
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return Guide("json_object")
        spec = fmt.json_schema
        if spec is None or spec.schema_ is None:
            where = "response_format.json_schema" + ("" if spec is None else ".schema")
            raise ProtocolError(f"{where} is required with type json_schema", where)
        return json_schema_guide(
            spec.schema_, bool(spec.strict), "response_format.json_schema.schema"
        )
    except GuideError as e:
        raise ProtocolError(str(e), e.param) from e


def _structured(so: StructuredOutputs) -> Guide:
    given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(so, k) is not None]
    if len(given) != 1:
        raise ProtocolError(
            "structured_outputs takes exactly one of json, regex, choice, grammar",
            "structured_outputs",
        )
    key = given[0]
    value, param = getattr(so, key), f"structured_outputs.{key.rstrip('_')}"
    if key == "json_":
        return json_schema_guide(value, False, param)
    if key == "choice":
        return choice_guide(value, param)
    return text_guide(key, value, param)
