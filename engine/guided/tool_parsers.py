"""Reading tool calls back out of a model's output, as it streams.

A parser is fed the output's text deltas and answers OpenAI's chat deltas: ``{"content": ...}``
for answer text and ``{"tool_calls": [{"index", "id", "type", "function": {"name",
"arguments"}}]}`` for calls (a call's id, type and name in its first delta, its arguments after).
The whole answer of a non-streamed request is the same deltas merged (``merged``), so a stream
and a whole answer can never disagree.

``generic`` reads the generic format's JSON (``engine.guided.tools``) while it is still incomplete
(pydantic-core's partial JSON parser): the answer's text streams as it grows; a call is
announced once its name is whole (its ``arguments`` key has begun) and its arguments are sent
once they are whole (the next call has begun, or the output has ended). Where the request asked
an answer format beside its tools, the generic output is a call or that answer itself: text that
has begun otherwise than a call does is the answer, its text streamed as the content as it is
written. ``hermes`` reads
``<tool_call>{json}</tool_call>`` blocks: the text before the first block is the answer's
content (held back while it could still be the start of a block), each block is a call once it
closes. A block that does not hold a call is left as text, as it was written.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from pydantic_core import from_json

from engine.guided.tools import ToolPlan

BEGIN, END = "<tool_call>", "</tool_call>"
CALLS = '{"tool_calls"'  # how the generic format's calls begin (xgrammar writes no whitespace)


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _args(value: Any) -> str:
    return orjson.dumps(value if value is not None else {}).decode()


class _Calls:
    """The calls announced so far, and the deltas that announce them."""

    def __init__(self) -> None:
        self.named = 0  # calls whose id and name were sent
        self.argued = 0  # calls whose arguments were sent

    def name(self, name: str) -> dict[str, Any]:
        self.named += 1
        call = {
            "index": self.named - 1,
            "id": call_id(),
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        return {"tool_calls": [call]}

    def arguments(self, value: Any) -> dict[str, Any]:
        self.argued += 1
        return {"tool_calls": [{"index": self.argued - 1, "function": {"arguments": _args(value)}}]}


class GenericParser:
    """The generic format: ``{"tool_calls": [...]}`` or ``{"content": "..."}``; ``answer``: or,
    in place of the latter, an answer in the format the request asked, as written."""

    def __init__(self, answer: bool = False) -> None:
        self.text = ""
        self.sent = ""  # the content sent so far
        self.calls = _Calls()
        self.answer = answer
        self.reading: str | None = None if answer else "calls"  # or "answer", once it shows

    def feed(self, delta: str) -> list[dict[str, Any]]:
        self.text += delta
        if self.reading is None and not CALLS.startswith(self.text):
            self.reading = "calls" if self.text.startswith(CALLS) else "answer"
        if self.reading == "answer":
            return self._answer()
        if self.reading is None:
            return []  # it may still become a call
        return self._deltas(self._parsed(), done=False)

    def finish(self, reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        if self.reading != "calls":
            return self._answer(), reason
        out = self._deltas(self._parsed(), done=True)
        if self.answer and not self.calls.named and not self.sent:
            out.append({"content": self.text})  # an answer that began as a call would
            self.sent = self.text
        if self.calls.named and reason == "stop":
            reason = "tool_calls"
        return out, reason

    def _answer(self) -> list[dict[str, Any]]:
        """The answer's text not sent yet, as content."""
        more, self.sent = self.text[len(self.sent) :], self.text
        return [{"content": more}] if more else []

    def _parsed(self) -> Any:
        try:
            return from_json(self.text, allow_partial="trailing-strings")
        except ValueError:
            return None

    def _deltas(self, obj: Any, done: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not isinstance(obj, dict):
            if done and not self.calls.named and self.text and not self.sent:
                out.append({"content": self.text})  # not the format at all: the text as it is
                self.sent = self.text
            return out
        content = obj.get("content")
        if isinstance(content, str) and content.startswith(self.sent) and content != self.sent:
            out.append({"content": content[len(self.sent) :]})
            self.sent = content
        calls = obj.get("tool_calls")
        if not isinstance(calls, list):
            return out
        calls = [c for c in calls if isinstance(c, dict)]
        for k, c in enumerate(calls):
            whole = done or k + 1 < len(calls)  # a later call has begun: this one is whole
            if k == self.calls.named and "arguments" in c and isinstance(c.get("name"), str):
                out.append(self.calls.name(c["name"]))
            if k == self.calls.argued and k < self.calls.named and whole:
                out.append(self.calls.arguments(c.get("arguments")))
        return out


class HermesParser:
    """Hermes/Qwen blocks: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``."""

    def __init__(self) -> None:
        self.text = ""
        self.done = 0  # the text read so far (sent, or taken into a call)
        self.calls = _Calls()

    def feed(self, delta: str) -> list[dict[str, Any]]:
        self.text += delta
        return self._deltas(final=False)

    def finish(self, reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        out = self._deltas(final=True)
        if self.calls.named and reason == "stop":
            reason = "tool_calls"
        return out, reason

    def _deltas(self, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            rest = self.text[self.done :]
            start = rest.find(BEGIN)
            if start < 0:
                keep = 0 if final else _partial_tag(rest)
                text = rest[: len(rest) - keep]
                if self.calls.named:
                    text = text.strip()  # the whitespace between and after blocks
                if text:
                    out.append({"content": text})
                self.done += len(rest) - keep
                return out
            if start:
                before = rest[:start] if not self.calls.named else rest[:start].strip()
                if before:
                    out.append({"content": before})
                self.done += start
                continue
            end = rest.find(END)
            if end < 0:
                if final:  # a block the output never closed: the text it is
                    out.append({"content": rest})
                    self.done += len(rest)
                return out
            call = _call(rest[len(BEGIN) : end])
            if call is None:
                out.append({"content": rest[: end + len(END)]})
            else:
                out += [self.calls.name(call[0]), self.calls.arguments(call[1])]
            self.done += end + len(END)


def _call(text: str) -> tuple[str, Any] | None:
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            return None
    return obj["name"], args


def _partial_tag(text: str) -> int:
    """How many of ``text``'s last characters could be the start of ``<tool_call>``."""
    for k in range(min(len(BEGIN) - 1, len(text)), 0, -1):
        if BEGIN.startswith(text[-k:]):
            return k
    return 0


def parser_for(plan: ToolPlan) -> GenericParser | HermesParser:
    """The reader of ``plan``'s output: its format's, told whether it may be an answer in the
    format asked beside the tools (auto; required and a named function are calls only)."""
    if plan.format == "hermes":
        return HermesParser()
    return GenericParser(answer=plan.answer is not None and plan.mode == "auto")


def merged(deltas: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """A whole message from its deltas: the content (None when there is none) and the calls."""
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    for d in deltas:
        if "content" in d:
            content.append(d["content"])
        for c in d.get("tool_calls", ()):
            if c["index"] == len(calls):
                calls.append(
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["function"]["name"], "arguments": ""},
                    }
                )
            calls[c["index"]]["function"]["arguments"] += c["function"].get("arguments", "")
    return ("".join(content) or None), calls
