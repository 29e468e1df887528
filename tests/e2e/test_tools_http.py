"""Tool calling against `engine serve` on the default model (whose chat template knows no tools:
the generic format), through the official openai client unmodified: `tool_choice` required,
named, auto and none; every call names one of the tools and its arguments validate against
that tool's parameters (`jsonschema`); a stream's tool-call deltas add up to the whole answer;
`parallel_tool_calls: false` is one call; and the round trip (call, tool message, answer)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.conftest import requires_default_model
from tests.e2e.conftest import API_KEY, WEATHER

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
pytestmark = requires_default_model

FLIGHT = {
    "type": "object",
    "properties": {
        "origin": {"type": "string", "maxLength": 20},
        "destination": {"type": "string", "maxLength": 20},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["origin", "destination", "passengers"],
}
TIMER = {
    "type": "object",
    "properties": {"minutes": {"type": "integer", "minimum": 1, "maximum": 120}},
    "required": ["minutes"],
}
PARAMS = {"get_weather": WEATHER, "book_flight": FLIGHT, "set_timer": TIMER}
TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "description": desc, "parameters": PARAMS[name]},
    }
    for name, desc in (
        ("get_weather", "The weather in a city now"),
        ("book_flight", "Book a flight between two cities"),
        ("set_timer", "Start a kitchen timer"),
    )
]
PROMPTS = [
    "What is the weather in Paris?",
    "Book me a flight from Oslo to Rome for two people.",
    "Set a timer for ten minutes.",
    "Is it raining in Tokyo right now?",
]


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=served.base + "/v1", api_key=API_KEY, timeout=600) as c:
        yield c


def ask(client, prompt: str, **extra):
    """One question with the three tools. One call an answer unless asked otherwise: allowed
    several, this 135M model goes on calling (the same call again) until max_tokens."""
    extra = {"parallel_tool_calls": False, "temperature": 0, "max_tokens": 120, **extra}
    return client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": prompt}], tools=TOOLS, **extra
    )


def check_call(call) -> tuple[str, dict]:
    """A call names one of the tools and its arguments validate against that tool's schema."""
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in PARAMS, call
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, PARAMS[call.function.name])
    return call.function.name, args


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_required_answers_are_valid_calls_of_the_tools(client, prompt):
    r = ask(client, prompt, tool_choice="required")
    [choice] = r.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call(call)


def test_a_named_function_is_the_one_called(client):
    r = ask(client, PROMPTS[0], tool_choice={"type": "function", "function": {"name": "set_timer"}})
    [call] = r.choices[0].message.tool_calls
    assert check_call(call)[0] == "set_timer" and r.choices[0].finish_reason == "tool_calls"


def test_parallel_calls_are_several_and_one_at_a_time_is_one(client):
    several = ask(client, PROMPTS[1], tool_choice="required", parallel_tool_calls=True)
    calls = several.choices[0].message.tool_calls
    assert len(calls) > 1  # this model, allowed more than one, writes more than one
    for call in calls[:-1]:  # the last may be cut by max_tokens
        check_call(call)
    for prompt in PROMPTS[:2]:
        r = ask(client, prompt, tool_choice="required", n=2, temperature=1.0, seed=7)
        for choice in r.choices:
            assert len(choice.message.tool_calls) == 1 and choice.finish_reason == "tool_calls"
            check_call(choice.message.tool_calls[0])


def test_auto_answers_with_calls_or_text_and_none_with_text(client):
    r = ask(client, PROMPTS[0], tool_choice="auto", n=3, temperature=1.0, seed=3)
    for choice in r.choices:
        m = choice.message
        if m.tool_calls:
            assert choice.finish_reason == "tool_calls" and m.content is None
            for call in m.tool_calls:
                check_call(call)
        else:
            assert isinstance(m.content, str) and not m.content.lstrip().startswith("{")
    plain = ask(client, PROMPTS[0], tool_choice="none")
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason in ("stop", "length")


def test_a_streamed_call_adds_up_to_the_whole_answer(client):
    whole = ask(client, PROMPTS[1], tool_choice="required")
    chunks = list(ask(client, PROMPTS[1], tool_choice="required", stream=True))
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in chunks:
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for d in choice.delta.tool_calls or ():
                c = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "args": ""})
                c["args"] += d.function.arguments or ""
    assert [r for r in reasons if r] == ["tool_calls"]
    want = [
        (c.function.name, json.loads(c.function.arguments))
        for c in whole.choices[0].message.tool_calls
    ]
    assert [(c["name"], json.loads(c["args"])) for c in calls.values()] == want
    assert all(c["id"] and c["id"].startswith("call_") for c in calls.values())


def test_the_round_trip_call_tool_result_answer(client):
    messages = [{"role": "user", "content": PROMPTS[0]}]
    first = client.chat.completions.create(
        model="smol",
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=200,
    )
    message = first.choices[0].message
    messages.append(message)  # the client's own message object, sent back as it is
    for call in message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"})
    second = client.chat.completions.create(
        model="smol", messages=messages, tools=TOOLS, temperature=0, max_tokens=60
    )
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length", "tool_calls")
    assert answer.message.content or answer.message.tool_calls
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the history was rendered


def test_the_clients_pydantic_tools_parse_unmodified(client):
    from typing import Literal

    class GetWeather(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=20)
        unit: Literal["celsius", "fahrenheit"]

    r = client.chat.completions.parse(
        model="smol",
        messages=[{"role": "user", "content": PROMPTS[0]}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=120,
    )
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)


ANSWER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "summary": {"type": "string", "maxLength": 60},
    },
    "required": ["city", "summary"],
    "additionalProperties": False,
}
ANSWER_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "forecast", "schema": ANSWER, "strict": True},
}


def test_tools_and_an_answer_schema_call_or_answer_in_the_schema(client):
    """OpenAI's agents' shape (tools and an output type): auto is a call or the schema's answer,
    streamed alike; required is a call; none is the schema's answer."""
    seen = set()
    for prompt in (PROMPTS[2], "Say hello to Oslo."):  # this model mostly calls, then answers
        r = ask(
            client,
            prompt,
            tool_choice="auto",
            response_format=ANSWER_FORMAT,
            n=4,
            seed=5,
            temperature=1.0,
        )
        for choice in r.choices:
            m = choice.message
            if m.tool_calls:
                assert choice.finish_reason == "tool_calls" and m.content is None
                check_call(m.tool_calls[0])
                seen.add("call")
            else:
                assert choice.finish_reason == "stop" and m.tool_calls is None
                jsonschema.validate(json.loads(m.content), ANSWER)
                seen.add("answer")
    required = ask(client, PROMPTS[1], tool_choice="required", response_format=ANSWER_FORMAT)
    [call] = required.choices[0].message.tool_calls
    assert check_call(call)[0] in PARAMS and required.choices[0].finish_reason == "tool_calls"
    plain = ask(client, PROMPTS[0], tool_choice="none", response_format=ANSWER_FORMAT)
    assert plain.choices[0].message.tool_calls is None
    jsonschema.validate(json.loads(plain.choices[0].message.content), ANSWER)
    assert seen == {"call", "answer"}, seen


def test_a_streamed_answer_in_the_schema_adds_up_to_the_whole_one(client):
    kw = {"tool_choice": "auto", "response_format": ANSWER_FORMAT}
    seen = set()
    for prompt in (PROMPTS[2], "Say hello to Oslo."):
        whole = ask(client, prompt, **kw).choices[0]
        text, names, reasons = "", [], []
        for chunk in ask(client, prompt, **kw, stream=True):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                names += [d.function.name for d in choice.delta.tool_calls or () if d.id]
                reasons.append(choice.finish_reason)
        assert [r for r in reasons if r] == [whole.finish_reason]
        if whole.message.tool_calls:
            assert names == [c.function.name for c in whole.message.tool_calls] and not text
            seen.add("call")
        else:
            assert text == whole.message.content and not names
            jsonschema.validate(json.loads(text), ANSWER)
            seen.add("answer")
    assert seen == {"call", "answer"}, seen
