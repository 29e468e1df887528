"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) over the
chat path: its request models, their translation into a chat request, and its answer, whole and
streamed.

A Messages request is translated into the chat route's own request (``ChatCompletionRequest``,
validated as a chat body is) and runs the chat's prompt (``CompletionService.chat_turn``) and
submission (``CompletionService.submit``): the tool plans, grammars, receipts and spans are the
chat's. What is this module's own is the Messages API's shape: the request's fields (a fault in
the translated request names the Messages field it came from, ``Origins``), and the answer's
content blocks and events, written from the chat's own deltas (``responses.chat_deltas``, the
tool-call parsers), so a stream and a whole answer cannot disagree. Its errors are in Anthropic's
shape (``errors.anthropic_error_body``; the app's error handlers pick it by the route).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.guided.tool_parsers import GenericParser, HermesParser, parser_for
from engine.guided.tools import ToolPlan
from engine.server import openapi
from engine.server.errors import ProtocolError, anthropic_error_body, validation_error
from engine.server.job import Job, JobFailed
from engine.server.limits import read_json
from engine.server.protocol import ChatCompletionRequest, check_model
from engine.server.responses import chat_deltas, error_for, sse
from engine.server.service import CompletionService, gathered

BLOCKS = ("text", "tool_use", "tool_result")  # the content blocks this server reads
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class _Strict(BaseModel):
    """Unknown fields refused, types as sent (as the chat route's models)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# prompt caching is automatic here (the prefix cache): a breakpoint asks for nothing more
CacheControl = dict[str, Any] | None


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl = None


class ToolUseBlock(_Strict):
    """An assistant's call of a tool, as an earlier turn sends it back."""

    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: str
    input: dict[str, Any]
    cache_control: CacheControl = None


class ToolResultBlock(_Strict):
    """What a call returned, in a user message."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl = None


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class MessageParam(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolParam(_Strict):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None  # a client tool; Anthropic's server tools are not
    cache_control: CacheControl = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # type "tool": the one tool to call
    disable_parallel_tool_use: bool | None = None


class CountTokensRequest(_Strict):
    """What ``/v1/messages/count_tokens`` counts: the prompt a Messages request would run."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # the caller's own tags: accepted and ignored


BODIES = [MessagesRequest, CountTokensRequest]


@dataclass(slots=True)
class Origins:
    """Where each field of a translated chat request came from in the Messages request
    (chat path -> Messages path), so a fault the chat path finds names what the client sent."""

    paths: dict[str, str] = field(default_factory=dict)

    def of(self, param: str | None) -> str | None:
        """The Messages field of a chat field: its longest known head renamed, the rest kept."""
        if param is None:
            return None
        parts = param.split(".")
        for k in range(len(parts), 0, -1):
            head = ".".join(parts[:k])
            if head in self.paths:
                return ".".join([self.paths[head], *parts[k:]])
        return param

    def renamed(self, e: ProtocolError) -> ProtocolError:
        param = self.of(e.param)
        if param == e.param or e.param is None or param is None:
            return e
        # the message names the chat field where it begins, or anywhere as a dotted path
        message = str(e)
        if message.startswith(e.param):
            message = param + message[len(e.param) :]
        if "." in e.param:
            message = re.sub(rf"(?<![\w.]){re.escape(e.param)}(?![\w])", param, message)
        return ProtocolError(message, param, e.status, e.headers)


def refuse_blocks(data: dict[str, Any]) -> None:
    """A content block of a type this server does not read (an image, a document, ...) is
    refused by name before anything else looks at the request: never dropped."""
    system = data.get("system")
    where: list[tuple[str, Any, tuple[str, ...]]] = []
    if isinstance(system, list):
        where.append(("system", system, ("text",)))
    messages = data.get("messages")
    for i, m in enumerate(messages if isinstance(messages, list) else ()):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        where.append((f"messages.{i}.content", content, BLOCKS))
        for j, b in enumerate(content):
            result = isinstance(b, dict) and b.get("type") == "tool_result"
            if result and isinstance(inner := b.get("content"), list):
                where.append((f"messages.{i}.content.{j}.content", inner, ("text",)))
    for path, blocks, known in where:
        for j, b in enumerate(blocks):
            kind = b.get("type") if isinstance(b, dict) else None
            if isinstance(kind, str) and kind not in known:
                raise ProtocolError(
                    f"{path}.{j}.type: {kind!r} blocks are not supported by this server "
                    f"(it reads {', '.join(known)} blocks here)",
                    f"{path}.{j}.type",
                )


async def parse(request: Request, model: type[BaseModel], service: CompletionService) -> Any:
    """The body as ``model`` (a Messages or count_tokens request); a ProtocolError naming the
    field at every fault."""
    data = await read_json(request, service.http)
    refuse_blocks(data)
    try:
        req = model.model_validate(data)
    except ValidationError as e:
        raise validation_error(model, e) from e
    check_model(req.model, service.served_name)
    return req


def _text(blocks: str | list[TextBlock] | None) -> str | list[dict[str, str]]:
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    return [{"type": "text", "text": b.text} for b in blocks]


def _user(
    m: MessageParam, i: int, asked: set[str], origins: Origins, out: list[dict[str, Any]]
) -> None:
    """A user message as chat messages: each tool_result a ``tool`` message (one answering a
    call of the message before), its text one ``user`` message."""
    if isinstance(m.content, str):
        origins.paths[f"messages.{len(out)}"] = f"messages.{i}"
        out.append({"role": "user", "content": m.content})
        return
    parts = []
    for j, b in enumerate(m.content):
        where = f"messages.{i}.content.{j}"
        if isinstance(b, ToolUseBlock):
            raise ProtocolError(
                f"{where}.type: tool_use blocks belong to assistant messages", f"{where}.type"
            )
        if isinstance(b, TextBlock):
            parts.append({"type": "text", "text": b.text})
            continue
        if b.tool_use_id not in asked:
            raise ProtocolError(
                f"{where}.tool_use_id: {b.tool_use_id!r} answers no tool_use block of the "
                "assistant message before it",
                f"{where}.tool_use_id",
            )
        content = _text(b.content)
        if b.is_error:  # the chat has no flag for it: the model reads it in the result
            text = content if isinstance(content, str) else "".join(p["text"] for p in content)
            content = f"Error: {text}"
        k = len(out)
        origins.paths.update(
            {f"messages.{k}": where, f"messages.{k}.tool_call_id": f"{where}.tool_use_id"}
        )
        out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": content})
    if parts:
        origins.paths[f"messages.{len(out)}"] = f"messages.{i}"
        out.append({"role": "user", "content": parts})


def _assistant(m: MessageParam, i: int, origins: Origins, out: list[dict[str, Any]]) -> set[str]:
    """An assistant message as a chat message: its text, its tool_use blocks as tool calls.
    The ids of its calls, which the next message's results answer."""
    k = len(out)
    origins.paths[f"messages.{k}"] = f"messages.{i}"
    if isinstance(m.content, str):
        out.append({"role": "assistant", "content": m.content})
        return set()
    parts, calls = [], []
    for j, b in enumerate(m.content):
        where = f"messages.{i}.content.{j}"
        if isinstance(b, ToolResultBlock):
            raise ProtocolError(
                f"{where}.type: tool_result blocks belong to user messages", f"{where}.type"
            )
        if isinstance(b, TextBlock):
            parts.append({"type": "text", "text": b.text})
            continue
        call = f"messages.{k}.tool_calls.{len(calls)}"
        origins.paths.update(
            {
                call: where,
                f"{call}.function.name": f"{where}.name",
                f"{call}.function.arguments": f"{where}.input",
            }
        )
        arguments = orjson.dumps(b.input).decode()
        calls.append(
            {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": arguments}}
        )
    out.append(
        {"role": "assistant", "content": parts or None, **({"tool_calls": calls} if calls else {})}
    )
    return {c["id"] for c in calls}


def _messages(req: CountTokensRequest, origins: Origins) -> list[dict[str, Any]]:
    """The chat's messages: the system prompt, then each message's (a user message's results
    each a ``tool`` message)."""
    out: list[dict[str, Any]] = []
    if req.system:
        origins.paths["messages.0"] = "system"
        out.append({"role": "system", "content": _text(req.system)})
    asked: set[str] = set()  # the calls of the message before, which results may answer
    for i, m in enumerate(req.messages):
        if m.role == "user":
            _user(m, i, asked, origins, out)
            asked = set()
        else:
            asked = _assistant(m, i, origins, out)
    last = len(req.messages) - 1
    if req.messages[last].role == "assistant":
        raise ProtocolError(
            f"messages.{last}: the last message is the assistant's; this server does not "
            "continue a prefilled answer: end with a user message",
            f"messages.{last}",
        )
    return out


def _tools(req: CountTokensRequest, origins: Origins) -> dict[str, Any]:
    """``tools`` as function tools and ``tool_choice`` as the chat's (any: required, tool: the
    named function; disable_parallel_tool_use: parallel_tool_calls false)."""
    out: dict[str, Any] = {}
    if req.tools is not None:
        out["tools"] = []
        for i, t in enumerate(req.tools):
            f = {"name": t.name, "description": t.description, "parameters": t.input_schema}
            out["tools"].append(
                {"type": "function", "function": {k: v for k, v in f.items() if v is not None}}
            )
            at = f"tools.{i}"
            origins.paths.update(
                {f"{at}.function": at, f"{at}.function.name": f"{at}.name"}
                | {f"{at}.function.description": f"{at}.description"}
                | {f"{at}.function.parameters": f"{at}.input_schema"}
            )
    choice = req.tool_choice
    if choice is None:
        return out
    if (choice.type == "tool") != (choice.name is not None):
        raise ProtocolError(
            "tool_choice.name: a tool_choice of type 'tool' names its tool, and only it",
            "tool_choice.name",
        )
    if choice.type == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    origins.paths.update(
        {"tool_choice.function.name": "tool_choice.name", "tool_choice.function": "tool_choice"}
        | {"parallel_tool_calls": "tool_choice.disable_parallel_tool_use"}
    )
    return out


def chat_request(req: CountTokensRequest, origins: Origins) -> ChatCompletionRequest:
    """The chat request a Messages request reads as, validated as a chat body is (a fault named
    as the Messages field it came from, through ``origins``)."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": _messages(req, origins),
        **_tools(req, origins),
    }
    if isinstance(req, MessagesRequest):
        body["max_tokens"] = req.max_tokens
        body["stream"] = req.stream
        if req.stop_sequences is not None:
            body["stop"] = req.stop_sequences
            origins.paths["stop"] = "stop_sequences"
        sampling = {"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k}
        body.update({k: v for k, v in sampling.items() if v is not None})
        if req.top_k == 0:  # Anthropic's 0 and the chat's -1 both ask for no top-k
            body["top_k"] = -1
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise origins.renamed(validation_error(ChatCompletionRequest, e)) from e


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


class Blocks:
    """A message's content blocks as they grow from the chat's deltas: each delta is the
    stream's events (a block started, its delta; the block before it stopped), and the whole
    answer's content is what those events built."""

    def __init__(self) -> None:
        self.content: list[dict[str, Any]] = []
        self.open: int | None = None  # the index of the block not yet stopped
        self.calls: dict[int, int] = {}  # a tool call's index -> its block's
        self.inputs: dict[int, str] = {}  # a tool_use block's input, as JSON so far

    def add(self, delta: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        text = delta.get("content")
        if text:
            if self.open is None or self.content[self.open]["type"] != "text":
                out += self._start({"type": "text", "text": ""})
            self.content[-1]["text"] += text
            out.append(_delta(len(self.content) - 1, {"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls", ()):
            f = call["function"]
            if "id" in call:  # a call's first delta: its id and name
                block = {
                    "type": "tool_use",
                    "id": _tool_id(call["id"]),
                    "name": f["name"],
                    "input": {},
                }
                out += self._start(block)
                self.calls[call["index"]] = len(self.content) - 1
                self.inputs[len(self.content) - 1] = ""
            if f.get("arguments"):
                at = self.calls[call["index"]]
                self.inputs[at] += f["arguments"]
                out.append(_delta(at, {"type": "input_json_delta", "partial_json": f["arguments"]}))
        return out

    def _start(self, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = self.stop()
        self.content.append(block)
        self.open = len(self.content) - 1
        start = {"type": "content_block_start", "index": self.open, "content_block": dict(block)}
        return [*out, ("content_block_start", start)]

    def stop(self) -> list[tuple[str, dict[str, Any]]]:
        """The open block's end (none when none is open)."""
        if self.open is None:
            return []
        at, self.open = self.open, None
        if at in self.inputs:
            self.content[at]["input"] = orjson.loads(self.inputs[at] or "{}")
        return [("content_block_stop", {"type": "content_block_stop", "index": at})]


def _delta(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def stop_reason(reason: str | None, stop_sequence: str | None) -> str | None:
    """The chat's finish reason as Anthropic's: a stop string that ended it is a
    ``stop_sequence`` (the engine says which); a stop token, ``end_turn``."""
    if reason == "stop" and stop_sequence is not None:
        return "stop_sequence"
    return STOP_REASONS.get(reason or "", reason)


def usage(job: Job) -> dict[str, int]:
    """Anthropic's usage: ``input_tokens`` are the prompt's tokens the prefix cache did not
    serve (those are ``cache_read_input_tokens``); nothing is charged for writing the cache."""
    return {
        "input_tokens": job.prompt_tokens - job.cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": job.cached,
        "output_tokens": sum(job.completion),
    }


def message(meta: dict[str, Any], job: Job, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        **meta,
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage(job),
    }


async def events(
    job: Job, meta: dict[str, Any], parser: GenericParser | HermesParser | None, blocks: Blocks
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The message's events, from its job's outputs: ``message_start`` (with the first output,
    when the prefix cache's share is known), each block's start, deltas and stop,
    ``message_delta`` (the stop reason, the usage), ``message_stop``. JobFailed as the job
    raises it."""
    started = False
    async for _, item in job.events():
        if not started:
            started = True
            yield "message_start", {"type": "message_start", "message": message(meta, job, [])}
        deltas, reason = chat_deltas(item, parser, False)
        for delta in deltas:
            for event in blocks.add(delta or {}):
                yield event
        if not item.finished:
            continue
        job.answered(0, reason)  # tool_calls where the scheduler said stop: the span says so
        for event in blocks.stop():
            yield event
        said = stop_reason(reason, item.stop_sequence)
        ended = {
            "stop_reason": said,
            "stop_sequence": item.stop_sequence if said == "stop_sequence" else None,
        }
        said_last = {"type": "message_delta", "delta": ended, "usage": usage(job)}
        if job.report_metrics:  # --enable-per-request-metrics: the timings, with the last usage
            said_last["metrics"] = job.metrics()
        yield "message_delta", said_last
        yield "message_stop", {"type": "message_stop"}


def event_bytes(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\n" + sse(data)


async def stream(
    job: Job, meta: dict[str, Any], parser: GenericParser | HermesParser | None
) -> AsyncIterator[bytes]:
    """The SSE body; a job that fails midway ends it with an ``error`` event. Closing it early
    aborts the request (its memory freed)."""
    status, error = 499, "the client went away"
    try:
        try:
            async for name, data in events(job, meta, parser, Blocks()):
                yield event_bytes(name, data)
        except JobFailed as e:
            status, error = e.status, str(e)
            yield event_bytes("error", anthropic_error_body(str(e), e.status))
        else:
            status, error = 200, None
    finally:
        job.close()  # a client that disconnected: its request aborts and its memory is freed
        job.end_span(status, error)


async def whole(
    job: Job, meta: dict[str, Any], parser: GenericParser | HermesParser | None, request: Request
) -> Response:
    """The whole message at once (the stream's events, folded), unless the client hangs up
    first (then 499, aborted)."""
    blocks, ended = Blocks(), {}

    async def gather() -> None:
        async for name, data in events(job, meta, parser, blocks):
            if name == "message_delta":
                ended.update(data["delta"])

    path = request.url.path
    failed = await gathered(
        job, gather(), request, lambda said, status: error_for(path, said, status)
    )
    if failed is not None:
        return failed
    body = {**message(meta, job, blocks.content), **ended}
    if job.report_metrics:
        body["metrics"] = job.metrics()
    return JSONResponse(body)


class MessagesRoute:
    """The two routes over one ``CompletionService``."""

    def __init__(self, service: CompletionService) -> None:
        self.service = service

    async def messages(self, request: Request) -> Response:
        t0 = time.time_ns()
        req = await parse(request, MessagesRequest, self.service)
        origins = Origins()
        chat = chat_request(req, origins)
        try:
            plan, ids = await self.service.chat_turn(chat)
            job, _ = await self.service.submit(ids, chat, "messages", "msg", request, t0, plan)
        except ProtocolError as e:
            raise origins.renamed(e) from e
        except JobFailed as e:
            return error_for(request.url.path, str(e), e.status)
        meta = {"id": job.rid.replace("-", "_", 1), "model": self.service.served_name}
        parser = _parser(plan)
        if req.stream:
            return StreamingResponse(stream(job, meta, parser), media_type="text/event-stream")
        return await whole(job, meta, parser, request)

    async def count_tokens(self, request: Request) -> Response:
        req = await parse(request, CountTokensRequest, self.service)
        origins = Origins()
        chat = chat_request(req, origins)
        try:
            _, ids = await self.service.chat_turn(chat)
        except ProtocolError as e:
            raise origins.renamed(e) from e
        return JSONResponse({"input_tokens": len(ids)})


def _parser(plan: ToolPlan | None) -> GenericParser | HermesParser | None:
    return parser_for(plan) if plan is not None and plan.active else None


def mount(app: FastAPI, service: CompletionService) -> None:
    route = MessagesRoute(service)
    errors = openapi.ANTHROPIC_ERRORS
    app.post("/v1/messages", **openapi.body(MessagesRequest, streams=True, errors=errors))(
        route.messages
    )
    app.post("/v1/messages/count_tokens", **openapi.body(CountTokensRequest, errors=errors))(
        route.count_tokens
    )
