"""What a request asks its output to match: OpenAI's ``response_format`` (``json_object``,
``json_schema``) or vLLM's ``structured_outputs`` (a JSON schema, a regex, choices, an EBNF
grammar), as a checked ``Guide``; every fault a ProtocolError naming the place."""

from __future__ import annotations

from engine.guided.tools import ToolPlan
from engine.request.guide import Guide, GuideError, choice_guide, json_schema_guide, text_guide
from engine.server.errors import ProtocolError
from engine.server.protocol import ResponseFormat, StructuredOutputs


def guide_of(
    fmt: ResponseFormat | None, vllm: StructuredOutputs | None, tools: ToolPlan | None = None
) -> tuple[Guide | None, str]:
    """What a request's ``response_format``, ``structured_outputs`` or tools ask the output to
    match, checked (a ProtocolError naming the place in the schema that cannot be honoured),
    and the field that asked."""
    asked = fmt is not None and fmt.type != "text" or vllm is not None
    field = "structured_outputs" if vllm is not None else "response_format"
    if tools is not None and tools.active:
        if asked:
            raise ProtocolError(
                f"{field} and tools (tool_choice {tools.mode!r}) both shape the output: send "
                "one, or tool_choice 'none'",
                field,
            )
        return tools.guide, "tools"
    return _guide(fmt, vllm), field


def _guide(fmt: ResponseFormat | None, vllm: StructuredOutputs | None) -> Guide | None:
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
