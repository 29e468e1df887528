"""Tool calling: what a chat request's ``tools`` and ``tool_choice`` ask, as a plan the server
follows: how the tools reach the prompt, what the output is held to, and how it is read back.

Two formats. A model whose chat template knows tools (Hermes/Qwen style: the template takes
``tools`` and the model writes ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``)
gets its own template and a parser for its blocks (``hermes``). Any other model (the default
one) gets the ``generic`` format: the tools are described in the system message and the output
is held by a JSON schema to either ``{"tool_calls": [{"name", "arguments"}, ...]}`` or
``{"content": "..."}`` (``required`` and a named function: the calls only), so even a model
that was never taught tools can only answer with a valid call or a plain answer.

With an answer format beside the tools (``response_format``, ``structured_outputs``), ``auto``
holds the output to the alternation of the calls and the answer in that format (one grammar,
``alternation``): a generic answer is then the answer itself, not ``{"content": ...}``, and is
read back as the message content as written; ``required`` and a named function are calls only,
as without it; ``none`` is the answer format only.

Torch-free and xgrammar-free, as ``engine.request.guide`` is: the HTTP process checks everything here
before a request is submitted (a ``GuideError`` naming the field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from engine.request.guide import (
    Guide,
    GuideError,
    alternation,
    bounded,
    json_schema_guide,
    subschemas,
)

CHOICES = ("none", "auto", "required")
_EMPTY = {"type": "object", "properties": {}}  # a function that takes no arguments


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of the arguments object


def tools_of(tools: list[Any]) -> list[Tool]:
    """The request's tools (``{"type": "function", "function": {...}}`` each, as the request
    schema has checked their shape); a GuideError naming a duplicate name or a parameters
    schema that cannot be held to, or tools that together pass the bound on a guide."""
    bounded(orjson.dumps(tools), "tools", "tools' definitions")
    out: list[Tool] = []
    seen: set[str] = set()
    for i, t in enumerate(tools):
        f = t["function"]
        name = f["name"]
        if name in seen:
            raise GuideError(f"tools.{i}.function.name: {name!r} names two tools", f"tools.{i}")
        seen.add(name)
        params = f.get("parameters") or _EMPTY
        json_schema_guide(params, True, f"tools.{i}.function.parameters")  # the checks only
        out.append(Tool(name, f.get("description") or "", params))
    return out


def choice_of(tool_choice: Any, tools: list[Tool]) -> tuple[str, str | None]:
    """``tool_choice`` as (mode, function name): ``none``, ``auto`` (the default with tools),
    ``required``, or ``named`` with the one function it names."""
    if tool_choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(tool_choice, str):
        if tool_choice != "none" and not tools:
            raise GuideError(f"tool_choice {tool_choice!r} needs tools", "tool_choice")
        return tool_choice, None
    name = tool_choice["function"]["name"]
    if name not in {t.name for t in tools}:
        known = ", ".join(repr(t.name) for t in tools) or "none"
        raise GuideError(
            f"tool_choice.function.name: {name!r} is not one of the tools ({known})",
            "tool_choice.function.name",
        )
    return "named", name


def _call_schema(i: int, tool: Tool) -> dict[str, Any]:
    """One call of ``tool``: its name, and its arguments held to its parameters (kept under
    ``$defs/t<i>``, so its own references are rewritten to point there)."""
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": {"$ref": f"#/$defs/t{i}"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _moved(params: dict[str, Any], i: int) -> dict[str, Any]:
    """``params`` with each reference inside it (``#``, ``#/...``) made to point at its new
    place, ``#/$defs/t<i>``."""
    moved = orjson.loads(orjson.dumps(params))  # a deep copy, ten times faster than copy's
    for _, node in subschemas(moved, ""):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            node["$ref"] = f"#/$defs/t{i}{ref[1:]}"
    return moved


def generic_schema(tools: list[Tool], mode: str, name: str | None, parallel: bool) -> dict:
    """The JSON schema of the generic format's output for ``mode`` (auto, required, named)."""
    items, defs = _calls(tools, name)
    array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel or mode == "named":
        array["maxItems"] = 1
    call_obj = {
        "type": "object",
        "properties": {"tool_calls": array},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    answer = {
        "type": "object",
        "properties": {"content": {"type": "string"}},
        "required": ["content"],
        "additionalProperties": False,
    }
    root: dict[str, Any] = {"anyOf": [call_obj, answer]} if mode == "auto" else call_obj
    root["$defs"] = defs
    return root


def _calls(tools: list[Tool], name: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The schema of one call of any of ``tools`` (only ``name``, when given), and the
    ``$defs`` its arguments' schemas are kept under."""
    chosen = [(i, t) for i, t in enumerate(tools) if name is None or t.name == name]
    calls = [_call_schema(i, t) for i, t in chosen]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return one, {f"t{i}": _moved(t.parameters, i) for i, t in chosen}


def _describe(tools: list[Tool]) -> str:
    lines = []
    for t in tools:
        entry = {"name": t.name, "description": t.description, "parameters": t.parameters}
        lines.append(orjson.dumps(entry).decode())
    return "\n".join(lines)


_REPLY = {
    "auto": 'Reply with one JSON object only: {"tool_calls": [{"name": <a function\'s name>, '
    '"arguments": <its arguments>}]} to call functions, or {"content": <your reply>} to '
    "answer without calling one.",
    "required": 'Reply with one JSON object only: {"tool_calls": [{"name": <a function\'s '
    'name>, "arguments": <its arguments>}]}: you must call at least one function.',
    "named": 'Reply with one JSON object only: {"tool_calls": [{"name": "%s", "arguments": '
    "<its arguments>}]}: you must call this function.",
}


def _answer_reply(answer: Guide) -> str:
    """How the generic format's system message asks for an answer in ``answer``'s format."""
    if answer.kind == "json_schema":
        shape = f"a JSON value in this JSON schema: {answer.spec}"
    elif answer.kind == "json_object":
        shape = "a JSON object"
    else:
        shape = "text in the format asked"
    return (
        'Reply with one JSON object {"tool_calls": [{"name": <a function\'s name>, '
        f'"arguments": <its arguments>}}]}} to call functions, or answer with {shape}.'
    )


def generic_system(
    tools: list[Tool], mode: str, name: str | None, parallel: bool, answer: Guide | None = None
) -> str:
    """What the system message says of the tools in the generic format (``answer``: the format
    an answer that calls none is held to, in auto)."""
    one = "" if parallel and mode != "named" else " Call one function at a time."
    reply = _REPLY[mode] % name if mode == "named" else _REPLY[mode]
    if answer is not None and mode == "auto":
        reply = _answer_reply(answer)
    return (
        "You can call these functions (each with the JSON schema of its arguments):\n"
        f"{_describe(tools)}\n\n{reply}{one}"
    )


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """How one chat request's tools are served. ``format``: ``generic`` or ``hermes``;
    ``mode``: ``none``, ``auto``, ``required`` or ``named`` (``name``); ``guide``: what the
    output is held to (None: free text, read back by the parser); ``answer``: the format the
    request asks of an answer that calls nothing (None: none asked)."""

    format: str
    mode: str
    name: str | None
    parallel: bool
    tools: tuple[Tool, ...]
    guide: Guide | None
    answer: Guide | None = None

    @property
    def active(self) -> bool:
        """Whether the output is read for calls (``none``: it is a plain answer)."""
        return self.mode != "none"

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The ``tools`` a native template gets (OpenAI's shape)."""
        if self.format != "hermes" or not self.active:
            return None
        out = []
        for t in self.tools:
            f = {"name": t.name, "description": t.description, "parameters": t.parameters}
            out.append({"type": "function", "function": {k: v for k, v in f.items() if v}})
        return out

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The chat as the template renders it: earlier calls and tool results in the format's
        own shape, and (generic) the tools described in the system message."""
        out = history(messages, self.format == "hermes")
        if self.format == "hermes" or not self.active:
            return out
        text = generic_system(list(self.tools), self.mode, self.name, self.parallel, self.answer)
        if out and out[0]["role"] in ("system", "developer"):
            first = out[0]
            return [
                {**first, "role": "system", "content": f"{first['content']}\n\n{text}"},
                *out[1:],
            ]
        return [{"role": "system", "content": text}, *out]


def plan_of(
    tools: list[Any] | None,
    tool_choice: Any,
    parallel: bool,
    native: bool,
    answer: Guide | None = None,
) -> ToolPlan | None:
    """The plan for a request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` (None
    when it names no tools); ``native``: the model's template knows tools (hermes);
    ``answer``: the format asked of an answer (``response_format``, ``structured_outputs``)."""
    if not tools and tool_choice in (None, "none"):
        return None
    specs = tools_of(tools or [])
    mode, name = choice_of(tool_choice, specs)
    fmt = "hermes" if native else "generic"
    return ToolPlan(
        fmt,
        mode,
        name,
        parallel,
        tuple(specs),
        _guide(specs, fmt, mode, name, parallel, answer),
        answer,
    )


def _guide(
    specs: list[Tool], fmt: str, mode: str, name: str | None, parallel: bool, answer: Guide | None
) -> Guide | None:
    """What the output is held to: calls, the answer's format, or either of them (auto with an
    answer format). Each tool's parameters were checked by tools_of; the wrapping is ours."""
    if mode == "none":
        return answer
    if fmt == "generic":
        # auto with an answer format: the calls' schema (as required has it) or the answer
        calls_only = mode if answer is None else ("named" if mode == "named" else "required")
        schema = generic_schema(specs, calls_only, name, parallel)
        calls = Guide("json_schema", orjson.dumps(schema).decode(), True)
    elif mode != "auto" or answer is not None:  # hermes: blocks, each a call of a chosen tool
        calls = hermes_guide(specs, name, parallel and mode != "named")
    else:
        return None  # hermes auto without a format: free text, read for blocks
    return alternation(calls, answer) if mode == "auto" and answer is not None else calls


def hermes_guide(tools: list[Tool], name: str | None, parallel: bool) -> Guide:
    """The output of a hermes model that must call: one ``<tool_call>`` block (more when
    ``parallel``), each a call of one of ``tools`` (only ``name``, when given)."""
    one, defs = _calls(tools, name)
    spec = {
        "begin": "<tool_call>\n",
        "end": "\n</tool_call>",
        "schema": {**one, "$defs": defs},
        "repeat": parallel,
    }
    return Guide("tagged_json", orjson.dumps(spec).decode(), True)


def arguments_of(text: str, param: str) -> Any:
    """A history call's ``arguments`` (a JSON string) as the object it holds."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise GuideError(f"{param} must be a JSON object in a string, got {text[:40]!r}", param)
    return value


def _calls_in(m: dict[str, Any], i: int) -> list[dict[str, Any]]:
    return [
        {
            "id": c.get("id"),
            "name": c["function"]["name"],
            "arguments": arguments_of(
                c["function"]["arguments"], f"messages.{i}.tool_calls.{j}.function.arguments"
            ),
        }
        for j, c in enumerate(m.get("tool_calls") or ())
    ]


def history(messages: list[dict[str, Any]], native: bool) -> list[dict[str, Any]]:
    """Earlier calls and tool results as the template can render them (``native``: it knows
    tools); with or without tools in this request, a chat's history keeps its calls."""
    if native:
        return [native_message(m, i) for i, m in enumerate(messages)]
    return generic_history(messages)


def native_message(m: dict[str, Any], i: int) -> dict[str, Any]:
    """Message ``i`` as a tool-aware template reads it: a call's arguments as an object."""
    if not m.get("tool_calls"):
        return m
    calls = [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": c["arguments"]},
        }
        for c in _calls_in(m, i)
    ]
    return {**m, "tool_calls": calls}


def generic_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat for a template that knows no tools: an assistant's calls written as the JSON
    the generic format has it write, and tool results (consecutive ones together) as a user
    message, ``{"tool_results": [{"name", "content"}, ...]}``."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = _calls_in(m, i)
            names.update({c["id"]: c["name"] for c in calls if c["id"]})
            written = {
                "tool_calls": [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
            }
            text = orjson.dumps(written).decode()
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            result = {"name": names.get(m.get("tool_call_id") or "", ""), "content": m["content"]}
            if out and out[-1].get("_results") is not None:
                out[-1]["_results"].append(result)
            else:
                out.append({"role": "user", "_results": [result]})
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")})
    for m in out:
        results = m.pop("_results", None)
        if results is not None:
            m["content"] = orjson.dumps({"tool_results": results}).decode()
    return out
