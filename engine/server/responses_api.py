"""OpenAI's Responses API, ``/v1/responses``, as a chat: the request models, their translation
into the chat route's request, and the answer's writers (one body, or the typed event stream).

A Responses request is read as the chat it stands for: ``instructions`` the system message, its
input items (after the stored conversation ``previous_response_id`` names) the messages, its flat
function tools the chat's tools, ``text.format`` the ``response_format``, ``max_output_tokens``
the ``max_tokens``. That chat goes the chat route's way (``CompletionService.chat_turn``, then
``submit`` as the ``responses`` API), so its tools, grammars, receipts and spans are the chat
route's own; only the answer is written here. Its text is read for calls by the chat route's
parsers (``chat_deltas``), and one ``Output`` turns those deltas into output items and their
events, so a streamed answer and a whole one cannot disagree.

A stored response (``store``, the default) is kept by ``response_store.ResponseStore``; with a
durable KV store its conversation (the prompt, then the answer as the next turn's prompt begins
with it, under the same instructions and tools) is checkpointed there through the scheduler
(``checkpoints.ask``), so the next turn loads that prefix instead of computing it, also after a
restart. Deleting the response unpins it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import orjson
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, ValidationError

from engine.guided.tool_parsers import GenericParser, HermesParser, parser_for
from engine.guided.tools import ToolPlan, arguments_of
from engine.observability import schema
from engine.request.guide import GuideError
from engine.server import checkpoints, openapi
from engine.server.errors import ProtocolError, error_body, field_path, shown
from engine.server.job import Job, JobFailed
from engine.server.limits import read_json
from engine.server.protocol import ChatCompletionRequest, ToolName, _Strict, check_model
from engine.server.response_store import ResponseStore
from engine.server.responses import chat_deltas, error_response
from engine.server.service import CompletionService, gathered

# the item and tool types OpenAI has that this server does not serve: refused by name
SERVED_ITEMS = ("message", "function_call", "function_call_output")
SERVED_PARTS = ("input_text", "output_text")


class ContentPart(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # what a client sends back of an answer it got
    logprobs: list[Any] | None = None


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: ToolName
    arguments: str  # a JSON object, as a string
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str
    id: str | None = None
    status: str | None = None


class FunctionTool(_Strict):
    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: str


FormatName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class TextFormat(_Strict):
    type: Literal["text", "json_schema", "json_object"]
    name: FormatName | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None


MetadataKey = Annotated[str, Field(max_length=64)]
MetadataValue = Annotated[str, Field(max_length=512)]


class ResponsesRequest(_Strict):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    text: TextConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    parallel_tool_calls: bool | None = True
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] | None = None
    user: str | None = None
    truncation: Literal["disabled"] | None = "disabled"


BODIES = (ResponsesRequest,)

# OpenAI's fields that ask for something this server does not do unless they hold nothing
_NOTHING: dict[str, tuple[Any, str]] = {
    "background": (
        lambda v: v in (None, False),
        "(a response run in the background) is not supported by this server",
    ),
    "include": (lambda v: v in (None, []), "is not supported: this server has nothing to include"),
    "reasoning": (lambda v: v is None, "is not supported: the served model does not reason"),
    "conversation": (lambda v: v is None, "is not supported: use previous_response_id"),
    "prompt": (lambda v: v is None, "(a stored prompt template) is not supported by this server"),
    "max_tool_calls": (lambda v: v is None, "is not supported by this server"),
    "top_logprobs": (lambda v: v in (None, 0), "is not supported on /v1/responses"),
}
_INERT = frozenset({"service_tier", "prompt_cache_key", "safety_identifier"})


def _invalid(prefix: str, model: type[BaseModel], e: ValidationError) -> ProtocolError:
    first = e.errors()[0]
    param = ".".join(p for p in (prefix, field_path(model, tuple(first["loc"]))) if p)
    if first["type"] == "extra_forbidden":
        return ProtocolError(f"{param} is not supported by this server", param)
    return ProtocolError(f"{param}: {first['msg']}", param)


def parse_request(data: dict[str, Any], served: str) -> ResponsesRequest:
    """The body as a ResponsesRequest; every fault a ProtocolError naming the field."""
    kept = {}
    for key, value in data.items():
        if key in _NOTHING:
            accepts, why = _NOTHING[key]
            if not accepts(value):
                raise ProtocolError(f"{key} {why}", key)
        elif key not in _INERT:
            kept[key] = value
    try:
        req = ResponsesRequest.model_validate(kept)
    except ValidationError as e:
        raise _invalid("", ResponsesRequest, e) from e
    check_model(req.model, served)
    return req


def _hex() -> str:
    return uuid.uuid4().hex[:24]


def _text_of(content: str | list[ContentPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def input_items(raw: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's input as the items it is stored and listed as, each with an id; a
    ProtocolError naming the item (``input.3.type``) for what this server does not serve."""
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not raw:
        raise ProtocolError("input: give at least one item", "input")
    return [_item(i, x) for i, x in enumerate(raw)]


def _item(i: int, raw: Any) -> dict[str, Any]:
    where = f"input.{i}"
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where}: an item is a JSON object, got {shown(raw)}", where)
    kind = raw.get("type", "message" if "role" in raw else None)
    if kind not in SERVED_ITEMS:
        raise ProtocolError(
            f"{where}.type: {shown(kind)} items are not served by this server (it serves "
            f"{', '.join(SERVED_ITEMS)})",
            f"{where}.type",
        )
    if kind == "message" and isinstance(raw.get("content"), list):
        for j, part in enumerate(raw["content"]):
            ptype = part.get("type") if isinstance(part, dict) else None
            if ptype not in SERVED_PARTS:
                param = f"{where}.content.{j}.type"
                raise ProtocolError(
                    f"{param}: {shown(ptype)} content is not served by this server (text only: "
                    f"{', '.join(SERVED_PARTS)})",
                    param,
                )
    model = {
        "message": MessageItem,
        "function_call": FunctionCallItem,
        "function_call_output": FunctionCallOutputItem,
    }[kind]
    try:
        item = model.model_validate(raw)
    except ValidationError as e:
        raise _invalid(where, model, e) from e
    if isinstance(item, FunctionCallItem):
        try:
            arguments_of(item.arguments, f"{where}.arguments")
        except GuideError as e:
            raise ProtocolError(str(e), e.param) from e
    return _stored(item)


def _stored(item: MessageItem | FunctionCallItem | FunctionCallOutputItem) -> dict[str, Any]:
    """An input item as it is kept and listed (OpenAI's shapes, an id on each)."""
    if isinstance(item, MessageItem):
        part = "output_text" if item.role == "assistant" else "input_text"
        text = {"type": part, "text": _text_of(item.content)}
        if item.role == "assistant":
            text["annotations"] = []
        return {
            "type": "message",
            "id": item.id or f"msg_{_hex()}",
            "role": item.role,
            "content": [text],
            "status": "completed",
        }
    out = item.model_dump(exclude_none=True)
    out["id"] = item.id or (f"fc_{_hex()}" if item.type == "function_call" else f"fco_{_hex()}")
    out["status"] = "completed"
    return out


def chat_messages(items: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    """The chat the items stand for: messages as messages, consecutive calls (and the answer
    text before them) as one assistant message's ``tool_calls``, each call's output a ``tool``
    message; an output whose call is nowhere before it is refused (``input.N.call_id``,
    ``first``: the index of the request's own first item in ``items``)."""
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    for k, item in enumerate(items):
        kind = item["type"]
        if kind == "message":
            text = "".join(p["text"] for p in item["content"])
            messages.append({"role": item["role"], "content": text})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            calls.add(item["call_id"])
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and k and _joins(items[k - 1]):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            if item["call_id"] not in calls:
                param = f"input.{max(k - first, 0)}.call_id"
                raise ProtocolError(
                    f"{param}: no function_call with call_id {item['call_id']!r} comes before "
                    "this output",
                    param,
                )
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    return messages


def _joins(before: dict[str, Any]) -> bool:
    """Whether a call continues the assistant message of the item before it."""
    return before["type"] == "function_call" or (
        before["type"] == "message" and before["role"] == "assistant"
    )


def chat_tools(req: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    """The request's flat function tools and its tool choice in the chat's shapes."""
    tools = None
    if req.tools is not None:
        tools = []
        for i, raw in enumerate(req.tools):
            kind = raw.get("type") if isinstance(raw, dict) else None
            if kind != "function":
                raise ProtocolError(
                    f"tools.{i}.type: {shown(kind)} tools are not served by this server "
                    "(function tools only)",
                    f"tools.{i}.type",
                )
            try:
                tool = FunctionTool.model_validate(raw)
            except ValidationError as e:
                raise _invalid(f"tools.{i}", FunctionTool, e) from e
            fn = tool.model_dump(exclude_none=True, exclude={"type"})
            tools.append({"type": "function", "function": fn})
    choice: Any = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise ProtocolError(
                f"tool_choice.type: {shown(choice.get('type'))} is not served by this server "
                "(none, auto, required, or {'type': 'function', 'name': ...})",
                "tool_choice.type",
            )
        try:
            named = FunctionChoice.model_validate(choice)
        except ValidationError as e:
            raise _invalid("tool_choice", FunctionChoice, e) from e
        choice = {"type": "function", "function": {"name": named.name}}
    return tools, choice


def response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else {"type": fmt.type}
    if fmt.name is None or fmt.schema_ is None:
        missing = "text.format.name" if fmt.name is None else "text.format.schema"
        raise ProtocolError(f"{missing} is required with type json_schema", missing)
    spec = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
    if fmt.description is not None:
        spec["description"] = fmt.description
    return {"type": "json_schema", "json_schema": spec}


def chat_body(
    req: ResponsesRequest, history: list[dict[str, Any]], items: list[dict[str, Any]]
) -> dict[str, Any]:
    """The chat request (a dict for ``ChatCompletionRequest``) the Responses request stands
    for, with the conversation ``history`` before its own ``items``."""
    messages = chat_messages(history + items, len(history))
    if req.instructions is not None:
        messages = [{"role": "system", "content": req.instructions}, *messages]
    tools, choice = chat_tools(req)
    body: dict[str, Any] = {
        "messages": messages,
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "response_format": response_format(req),
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "user": req.user,
        "stream": bool(req.stream),
    }
    return {k: v for k, v in body.items() if v is not None}


def as_chat(body: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:  # what the item checks let through: the input as a whole
        first = e.errors()[0]
        raise ProtocolError(f"input: {first['msg']} (at messages.{first['loc']})", "input") from e


class Output:
    """A response's output items, built from the chat deltas of its text (``chat_deltas``):
    a message for answer text, a function_call for each call. ``feed`` and ``finish`` return
    the stream's events (without ``sequence_number``) as the items open, grow and close."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written
        self.calls: dict[int, dict[str, Any]] = {}  # by the chat delta's call index

    def feed(self, delta: dict[str, Any] | None) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if not delta:
            return events
        if delta.get("content"):
            if self.open is None or self.open["type"] != "message":
                events += self._close("completed") + self._open_message()
            part = self.open["content"][0]  # type: ignore[index]
            part["text"] += delta["content"]
            events.append(
                self._at(
                    {
                        "type": "response.output_text.delta",
                        "content_index": 0,
                        "delta": delta["content"],
                        "logprobs": [],
                    }
                )
            )
        for c in delta.get("tool_calls", ()):
            if "id" in c:
                events += self._close("completed") + self._open_call(c)
            args = c["function"].get("arguments")
            call = self.calls.get(c["index"])
            if args and call is not None:
                call["arguments"] += args
                events.append(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": call["id"],
                        "output_index": self.items.index(call),
                        "delta": args,
                    }
                )
        return events

    def _at(self, event: dict[str, Any]) -> dict[str, Any]:
        assert self.open is not None
        return {**event, "item_id": self.open["id"], "output_index": len(self.items) - 1}

    def _open_message(self) -> list[dict[str, Any]]:
        item = {
            "type": "message",
            "id": f"msg_{_hex()}",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        self.items.append(item)
        self.open = item
        added = {
            "type": "response.output_item.added",
            "output_index": len(self.items) - 1,
            "item": orjson.loads(orjson.dumps(item)),
        }
        part = {"type": "output_text", "text": "", "annotations": []}
        item["content"].append(part)
        return [
            added,
            self._at(
                {"type": "response.content_part.added", "content_index": 0, "part": dict(part)}
            ),
        ]

    def _open_call(self, c: dict[str, Any]) -> list[dict[str, Any]]:
        item = {
            "type": "function_call",
            "id": f"fc_{_hex()}",
            "call_id": c["id"],
            "name": c["function"]["name"],
            "arguments": "",
            "status": "in_progress",
        }
        self.items.append(item)
        self.calls[c["index"]] = item
        self.open = item
        return [
            {
                "type": "response.output_item.added",
                "output_index": len(self.items) - 1,
                "item": dict(item),
            }
        ]

    def _close(self, status: str) -> list[dict[str, Any]]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = self.items.index(item)
        item["status"] = status
        events: list[dict[str, Any]] = []
        if item["type"] == "message":
            part = item["content"][0]
            base = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += [
                {"type": "response.output_text.done", **base, "text": part["text"], "logprobs": []},
                {"type": "response.content_part.done", **base, "part": dict(part)},
            ]
        else:
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
        done = orjson.loads(orjson.dumps(item))
        events.append({"type": "response.output_item.done", "output_index": index, "item": done})
        return events

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close the item being written (a message cut by the length: ``incomplete``); an
        answer of nothing is an empty message."""
        if not self.items:
            events = self._open_message()
            return events + self._close(status)
        return self._close(status)


class ResponsesRoute:
    """``/v1/responses`` over a CompletionService, its stored responses in ``store``."""

    def __init__(self, service: CompletionService, store: ResponseStore) -> None:
        self.service = service
        self.store = store

    async def create(self, request: Request) -> Response:
        t0 = time.time_ns()
        data = await read_json(request, self.service.http)
        req = parse_request(data, self.service.served_name)
        items = input_items(req.input)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            before = self.store.get(req.previous_response_id, "previous_response_id")
            history = before["history"] + before["input"] + before["response"]["output"]
        body = chat_body(req, history, items)
        chat = as_chat(body)
        plan, ids = await self.service.chat_turn(chat)
        try:
            job, _ = await self.service.submit(ids, chat, "responses", "resp", request, t0, plan)
        except JobFailed as e:
            return error_response(str(e), e.status)
        turn = Turn(self, req, job, plan, body, history, items)
        if req.stream:
            return StreamingResponse(turn.events(), media_type="text/event-stream")
        return await turn.collect(request)

    async def retrieve(self, rid: str) -> Response:
        return JSONResponse(self.store.get(rid)["response"])

    async def delete(self, rid: str) -> Response:
        record = self.store.delete(rid)
        if record.get("checkpoint"):  # its pins go with it (a conversation it shares stays)
            await checkpoints.ask(self.service, "delete", id=record["checkpoint"])
        return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})

    async def input_items(
        self,
        rid: str,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
    ) -> Response:
        record = self.store.get(rid)
        items = record["history"] + record["input"]
        if order == "desc":
            items = items[::-1]
        if after is not None:
            ids = [x["id"] for x in items]
            if after not in ids:
                raise ProtocolError(f"after: no item {after!r} in this response's input", "after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )


class Turn:
    """One response being answered: its job's outputs read for calls, written as one body or
    as events, then stored (and its conversation checkpointed) when asked."""

    def __init__(
        self,
        route: ResponsesRoute,
        req: ResponsesRequest,
        job: Job,
        plan: ToolPlan | None,
        chat: dict[str, Any],
        history: list[dict[str, Any]],
        items: list[dict[str, Any]],
    ) -> None:
        self.route, self.req, self.job, self.plan = route, req, job, plan
        self.chat, self.history, self.items = chat, history, items
        self.id = "resp_" + job.rid.split("-", 1)[1]
        self.created = int(time.time())
        self.output = Output()
        self.reason: str | None = None
        active = plan is not None and plan.active
        self.parser: GenericParser | HermesParser | None = (
            parser_for(plan) if active else None  # type: ignore[arg-type]
        )

    def status(self) -> str:
        return "incomplete" if self.reason == "length" else "completed"

    def body(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object as it stands (``status``: ``in_progress`` until it ends)."""
        req, done = self.req, status not in ("in_progress",)
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        fmt = req.text.format if req.text is not None and req.text.format else None
        body = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "model": self.route.service.served_name,
            "output": orjson.loads(orjson.dumps(self.output.items)) if done else [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "store": req.store is not False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)}
            if fmt
            else {"format": {"type": "text"}},
            "tool_choice": req.tool_choice or ("auto" if req.tools else "none"),
            "tools": [_flat(t) for t in (self.chat.get("tools") or ())],
            "truncation": "disabled",
            "user": req.user,
            "background": False,
            "usage": self.usage() if done else None,
        }
        if done and self.job.report_metrics:  # --enable-per-request-metrics, as vLLM's
            body["metrics"] = self.job.metrics()
        return body

    def usage(self) -> dict[str, Any]:
        u = self.job.usage()
        return {
            "input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": self.job.cached},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"],
        }

    async def _steps(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Each output of the job as the events it makes; the ending's closes the items."""
        async for i, out in self.job.events():
            deltas, reason = chat_deltas(out, self.parser, False)
            events = [e for d in deltas for e in self.output.feed(d)]
            if out.finished:
                self.reason = reason
                self.job.answered(i, reason)
                events += self.output.finish("incomplete" if reason == "length" else "completed")
            yield events

    async def collect(self, request: Request) -> Response:
        """The whole response, unless the client hangs up first (then 499, aborted)."""

        async def gather() -> None:
            async for _ in self._steps():
                pass

        if (instead := await gathered(self.job, gather(), request)) is not None:
            return instead
        body = self.body(self.status())
        await self.keep(body)
        return JSONResponse(body)

    async def events(self) -> AsyncIterator[bytes]:
        """The typed event stream: created, in_progress, each item's events, then completed
        (incomplete, or failed with the error). Closing it early aborts the request."""
        seq = 0
        status, error = 499, "the client went away"

        def sse(event: dict[str, Any]) -> bytes:
            nonlocal seq
            event = {**event, "sequence_number": seq}
            seq += 1
            data = orjson.dumps(event)
            return b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n"

        try:
            yield sse({"type": "response.created", "response": self.body("in_progress")})
            yield sse({"type": "response.in_progress", "response": self.body("in_progress")})
            try:
                async for events in self._steps():
                    for event in events:
                        yield sse(event)
            except JobFailed as e:
                status, error = e.status, str(e)
                failed = error_body(str(e), e.status)["error"]
                err = {"code": "server_error", "message": failed["message"]}
                yield sse({"type": "response.failed", "response": self.body("failed", err)})
                return
            status, error = 200, None
            body = self.body(self.status())
            await self.keep(body)
            yield sse({"type": f"response.{body['status']}", "response": body})
        finally:
            self.job.close()
            self.job.end_span(status, error)

    async def keep(self, body: dict[str, Any]) -> None:
        """Store the response when asked (``store``, the default), its conversation
        checkpointed first where the server has a durable store."""
        if self.req.store is False:
            return
        store = self.route.store
        cid = await self.checkpoint(body["output"]) if store.durable else None
        record = {"response": body, "history": self.history, "input": self.items}
        store.put(self.id, {**record, "checkpoint": cid})

    async def checkpoint(self, output: list[dict[str, Any]]) -> str | None:
        """Pin the conversation as the next turn's prompt begins with it (this prompt, then
        its answer, under the same instructions and tools) in the durable store, under this
        response's id; None (and ``response.uncheckpointed``) where the store refused it."""
        service = self.route.service
        items = self.history + self.items + output
        messages = chat_messages(items, 0)
        if self.req.instructions is not None:
            messages = [{"role": "system", "content": self.req.instructions}, *messages]
        conv = as_chat({**self.chat, "messages": messages, "add_generation_prompt": False})
        try:
            _, ids = await service.off_loop(service.chat_prompt, conv)
        except ProtocolError as e:  # the answer is sent all the same; its prefix is not kept
            status, answer, ids = e.status, {"message": str(e)}, []
        else:
            status, answer = await checkpoints.ask(service, "create", tokens=ids, id=self.id)
        if status == 200:
            return self.id
        service.driver.record(
            schema.RESPONSE_UNCHECKPOINTED,
            id=self.id,
            status=status,
            reason=str(answer.get("message", ""))[:300],
            tokens=len(ids),
        )
        return None


def _flat(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat tool in the Responses API's flat shape."""
    fn = tool["function"]
    return {
        "type": "function",
        "name": fn["name"],
        "description": fn.get("description"),
        "parameters": fn.get("parameters"),
        "strict": fn.get("strict", True),
    }


def mount(app: FastAPI, service: CompletionService, store: ResponseStore) -> ResponsesRoute:
    route = ResponsesRoute(service, store)
    app.post("/v1/responses", **openapi.body(ResponsesRequest, streams=True))(route.create)
    app.get("/v1/responses/{rid}")(route.retrieve)
    app.delete("/v1/responses/{rid}")(route.delete)
    app.get("/v1/responses/{rid}/input_items")(route.input_items)
    return route
