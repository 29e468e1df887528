"""The Messages API's own part, without a server: a Messages request translated into the chat
request it reads as (each fault named as the Messages field it came from), and the answer's
events and content blocks written from a job's outputs, whole and streamed alike."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from engine.guided.tool_parsers import parser_for
from engine.guided.tools import plan_of
from engine.request.messages import StepOutput
from engine.server.errors import ProtocolError, validation_error
from engine.server.messages_api import (
    Blocks,
    MessagesRequest,
    Origins,
    chat_request,
    events,
    refuse_blocks,
    stop_reason,
    stream,
)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"name": "get_weather", "description": "The weather", "input_schema": WEATHER}]
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
RESULT = {
    "type": "tool_result",
    "tool_use_id": "toolu_1",
    "content": [{"type": "text", "text": "9 C"}],
}
TURNS = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, USE]},
    {"role": "user", "content": [RESULT, {"type": "text", "text": "And tomorrow?"}]},
]


def request(**fields) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": TURNS, **fields}
    body = {k: v for k, v in body.items() if v is not None}  # None: the field left out
    refuse_blocks(body)
    try:
        return MessagesRequest.model_validate(body)
    except ValidationError as e:  # named as the route names it
        raise validation_error(MessagesRequest, e) from e


def refusal(**fields) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        chat_request(request(**fields), Origins())
    return caught.value


def test_a_messages_request_reads_as_the_chat_request_of_the_same_turns():
    choice = {"type": "any", "disable_parallel_tool_use": True}
    chat = chat_request(
        request(system="Be brief.", tools=TOOLS, tool_choice=choice, stop_sequences=["##"]),
        Origins(),
    )
    got = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert [m["role"] for m in got] == ["system", "user", "assistant", "tool", "user"]
    [call] = got[2]["tool_calls"]
    assert (call["id"], call["function"]["name"]) == ("toolu_1", "get_weather")
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert got[3] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": [{"type": "text", "text": "9 C"}],
    }
    assert chat.tools[0].function.parameters == WEATHER
    assert (chat.tool_choice, chat.parallel_tool_calls, chat.stop) == ("required", False, ["##"])
    named = chat_request(
        request(tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}), Origins()
    )
    assert named.tool_choice.function.name == "get_weather"


def test_an_error_result_says_so_to_the_model():
    turns = [
        *TURNS[:2],
        {"role": "user", "content": [{**RESULT, "content": "timed out", "is_error": True}]},
    ]
    chat = chat_request(request(messages=turns), Origins())
    assert chat.messages[-1].content == "Error: timed out"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{**TOOLS[0], "name": "get weather"}]}, "tools.0.name"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"stop_sequences": [""]}, "stop_sequences.0"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
        (
            {"messages": [TURNS[0], {"role": "user", "content": [RESULT]}]},
            "messages.1.content.0.tool_use_id",
        ),
        ({"messages": TURNS[:2]}, "messages.1"),
        ({"messages": [{"role": "user", "content": [USE]}]}, "messages.0.content.0.type"),
    ],
)
def test_a_fault_in_the_translation_names_the_messages_field(fields, param):
    e = refusal(**fields)
    assert e.param == param and str(e).startswith(param), str(e)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"messages": [TURNS[0], {"role": "assistant", "content": [{**USE, "input": "Oslo"}]}]},
            "messages.1.content.0.input",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
            "messages.0.content.0.text",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{**RESULT, "content": [{"type": "document"}]}]}
                ]
            },
            "messages.0.content.0.content.0.type",
        ),
        ({"system": [{"type": "image"}]}, "system.0.type"),
        ({"top_k": -1}, "top_k"),
        ({"thinking": {"type": "enabled"}}, "thinking"),
    ],
)
def test_a_fault_in_the_request_names_its_field(fields, param):
    with pytest.raises(ProtocolError) as caught:
        request(**fields)
    assert caught.value.param == param, str(caught.value)


class FakeJob:
    """What the Messages answer reads of a job: one choice's outputs and its counts."""

    def __init__(self, pieces: list[str], reason: str, stop: str | None = None) -> None:
        self.prompt_tokens, self.cached, self.completion = 10, 4, [len(pieces)]
        self.reasons: list[str | None] = [reason]
        self.report_metrics = False  # the server's default: no per-request timings
        last = len(pieces) - 1
        self.outputs = [
            StepOutput(
                rid="r",
                new_token_ids=[k],
                text_delta=p,
                finished=k == last,
                finish_reason=reason if k == last else None,
                stop_sequence=stop if k == last else None,
            )
            for k, p in enumerate(pieces)
        ]
        self.closed = False

    async def events(self):
        for out in self.outputs:
            yield 0, out

    def answered(self, i: int, reason: str | None) -> None:
        self.reasons[i] = reason

    def close(self) -> None:
        self.closed = True

    def end_span(self, status: int, error: str | None = None) -> None:
        self.ended = (status, error)


def collect(job, parser=None) -> tuple[list[tuple[str, dict]], Blocks]:
    blocks = Blocks()

    async def go():
        return [e async for e in events(job, {"id": "msg_1", "model": "m"}, parser, blocks)]

    return asyncio.run(go()), blocks


def test_a_text_answer_is_one_text_block_between_start_and_stop():
    evs, blocks = collect(FakeJob(["Hel", "lo", ""], "stop"))
    assert [n for n, _ in evs] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert blocks.content == [{"type": "text", "text": "Hello"}]
    assert evs[0][1]["message"]["usage"]["input_tokens"] == 6  # the prompt less the cached
    assert evs[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


@pytest.mark.parametrize(
    ("reason", "stop", "said"),
    [("stop", None, "end_turn"), ("stop", "##", "stop_sequence"), ("length", None, "max_tokens")],
)
def test_the_finish_reason_is_anthropics_stop_reason(reason, stop, said):
    evs, _ = collect(FakeJob(["a"], reason, stop))
    assert evs[-2][1]["delta"] == {"stop_reason": said, "stop_sequence": stop}
    assert stop_reason("tool_calls", None) == "tool_use"


def test_a_call_is_a_tool_use_block_with_its_input_as_json_deltas():
    plan = plan_of(
        [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
        "required",
        False,
        False,
    )
    text = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]})
    job = FakeJob([text[:20], text[20:]], "stop")
    evs, blocks = collect(job, parser_for(plan))
    starts = [d["content_block"] for n, d in evs if n == "content_block_start"]
    assert [(b["type"], b["name"], b["input"]) for b in starts] == [("tool_use", "get_weather", {})]
    assert starts[0]["id"].startswith("toolu_")
    partial = "".join(d["delta"]["partial_json"] for n, d in evs if n == "content_block_delta")
    assert json.loads(partial) == {"city": "Oslo"} == blocks.content[0]["input"]
    assert evs[-2][1]["delta"]["stop_reason"] == "tool_use" and job.reasons == ["tool_calls"]


def test_a_stream_is_named_events_and_closes_its_job():
    job = FakeJob(["Hi"], "length")

    async def go():
        return b"".join([b async for b in stream(job, {"id": "msg_1", "model": "m"}, None)])

    raw = asyncio.run(go()).decode()
    frames = [f.split("\n") for f in raw.strip().split("\n\n")]
    assert [f[0] for f in frames][0] == "event: message_start"
    assert all(json.loads(f[1][len("data: ") :])["type"] == f[0][len("event: ") :] for f in frames)
    assert job.closed and job.ended == (200, None)
