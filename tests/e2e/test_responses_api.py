"""OpenAI's Responses API against `engine serve` on the default model, through the official
openai client unmodified: a plain answer, the same answer streamed (its typed events in order,
its deltas adding up to the whole), a function call and its output answered in the next turn
(``previous_response_id``), a ``text.format`` JSON schema, the stored responses' GET, DELETE and
input items, ``store: false``, bad input refused by name, and the receipts naming the API."""

from __future__ import annotations

import json
import time

import jsonschema
import orjson
import pytest

from tests.conftest import requires_default_model
from tests.e2e.conftest import API_KEY, WEATHER

openai = pytest.importorskip("openai")
pytestmark = requires_default_model

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": WEATHER,
    }
]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
GREEDY = {"model": "smol", "temperature": 0, "max_output_tokens": 24}


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=served.base + "/v1", api_key=API_KEY, timeout=600) as c:
        yield c


def test_a_plain_answer_parses_as_the_sdks_response(client):
    r = client.responses.create(input="Name a colour of the sky.", **GREEDY)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "smol"
    assert r.status in ("completed", "incomplete")
    assert [o.type for o in r.output] == ["message"]
    assert r.output[0].role == "assistant" and r.output[0].content[0].type == "output_text"
    assert r.output_text.strip()
    u = r.usage
    assert u.input_tokens > 0 and 0 < u.output_tokens <= 24
    assert u.total_tokens == u.input_tokens + u.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert r.store is True and r.tools == [] and r.text.format.type == "text"


def test_a_stream_is_the_typed_events_in_order_and_the_same_answer(client):
    ask = {"input": "Write one sentence about rivers.", "instructions": "Be brief.", **GREEDY}
    whole = client.responses.create(**ask)
    events = list(client.responses.create(stream=True, **ask))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    n = len(deltas)
    assert n >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * n,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{whole.status}",
    ]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    done = events[-1].response
    assert "".join(deltas) == events[-4].text == done.output_text == whole.output_text
    assert done.usage.output_tokens == whole.usage.output_tokens
    with client.responses.stream(**ask) as s:  # the SDK's helper accumulates the same text
        last = list(s)[-1]
    assert last.type == f"response.{whole.status}"
    assert last.response.output_text == whole.output_text


def test_a_function_call_and_its_output_answered_in_the_next_turn(client):
    first = client.responses.create(
        input="What is the weather in Paris?",
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        **{**GREEDY, "max_output_tokens": 80},
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1, first.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert first.tools[0].name == "get_weather" and first.tool_choice == "required"
    second = client.responses.create(
        previous_response_id=first.id,
        input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}
        ],
        tools=TOOLS,
        tool_choice="none",
        **{**GREEDY, "max_output_tokens": 40},
    )
    assert second.previous_response_id == first.id
    assert [o.type for o in second.output] == ["message"] and second.output_text.strip()
    # the stored conversation came first: the question, the call, then its output
    seen = client.responses.input_items.list(second.id, order="asc").data
    assert [i.type for i in seen] == ["message", "function_call", "function_call_output"]
    assert seen[1].call_id == call.call_id and seen[1].arguments == call.arguments
    streamed = list(
        client.responses.create(
            input="What is the weather in Paris?",
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            stream=True,
            **{**GREEDY, "max_output_tokens": 80},
        )
    )
    kinds = [e.type for e in streamed]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in streamed if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments  # greedy: the same call streamed
    assert kinds.index("response.function_call_arguments.done") < kinds.index(
        "response.output_item.done"
    )


def test_a_json_schema_format_answers_json_that_validates(client):
    r = client.responses.create(
        input="Invent a person: a name and an age.",
        text={
            "format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
        },
        **{**GREEDY, "max_output_tokens": 60},
    )
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"


def test_store_false_is_not_there_to_continue(client):
    r = client.responses.create(input="Hi.", store=False, **GREEDY)
    assert r.store is False
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(input="Again.", previous_response_id=r.id, **GREEDY)
    assert r.id in str(e.value) and "previous_response_id" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_get_delete_and_the_input_items_of_a_conversation(client):
    first = client.responses.create(
        input=[
            {"role": "developer", "content": "Answer in one word."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        ],
        metadata={"lane": "7"},
        **GREEDY,
    )
    second = client.responses.create(
        input="And once more?", previous_response_id=first.id, **GREEDY
    )
    got = client.responses.retrieve(second.id)
    assert got.model_dump() == second.model_dump()
    assert client.responses.retrieve(first.id).metadata == {"lane": "7"}
    items = client.responses.input_items.list(second.id, order="asc")
    roles = [(i.type, getattr(i, "role", None)) for i in items.data]
    assert roles == [
        ("message", "developer"),
        ("message", "user"),
        ("message", "assistant"),  # the first turn's answer
        ("message", "user"),
    ]
    assert items.data[2].id == first.output[0].id
    assert items.data[3].content[0].text == "And once more?"
    newest = client.responses.input_items.list(second.id, limit=1)  # desc, the default
    assert [i.id for i in newest.data] == [items.data[3].id] and newest.has_more
    after = client.responses.input_items.list(second.id, order="asc", after=items.data[1].id)
    assert [i.id for i in after.data] == [i.id for i in items.data[2:]] and not after.has_more
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(second.id)
    assert second.id in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(second.id)
    assert client.responses.retrieve(first.id).id == first.id  # the earlier turn stays


BAD = [
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.content.0.type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "hi", "tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools.0.type"),
    ({"input": "hi", "tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
    (
        {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
        "text.format.schema",
    ),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "frobnicate": 1}, "frobnicate"),
    (
        {"input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}]},
        "input.0.call_id",
    ),
    ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
    (
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "no"}]},
        "input.0.arguments",
    ),
    ({"input": []}, "input"),
    ({}, "input"),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    r = server.post("/v1/responses", json={"model": "smol", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err


def test_an_unknown_previous_response_id_is_a_404_naming_it(server):
    r = server.post("/v1/responses", json={"input": "hi", "previous_response_id": "resp_0abc"})
    assert r.status_code == 404 and "resp_0abc" in r.json()["error"]["message"]
    for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/input_items")):
        r = server.request(method, f"/v1/responses/resp_0abc{path}")
        assert r.status_code == 404 and "resp_0abc" in r.text, (method, path, r.text)


def test_the_request_received_receipt_names_the_responses_api(client, boot_log):
    r = client.responses.create(input="One word.", **GREEDY)
    rid = "resp-" + r.id.removeprefix("resp_")
    deadline = time.monotonic() + 60  # the scheduler process writes the log
    while True:
        rows = [orjson.loads(x) for x in boot_log.read_bytes().splitlines()]
        got = [x for x in rows if x.get("rid") == rid and x["event"] == "request.received"]
        if got:
            break
        assert time.monotonic() < deadline, "no request.received for " + rid
        time.sleep(0.2)
    assert got[0]["api"] == "responses"
