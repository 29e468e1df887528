"""Anthropic's Messages API against `engine serve` on the default model, over raw HTTP: a plain
answer, its stream (the events in Anthropic's order, the same text at temperature 0), a tool
round trip and a streamed call, count_tokens against the answer's usage, the key in `x-api-key`,
bad inputs refused in Anthropic's error shape naming the field, and the receipt naming the API.
With the `anthropic` SDK installed, the SDK itself against the server."""

from __future__ import annotations

import json
import select
import time

import httpx
import jsonschema
import pytest

from tests.conftest import requires_default_model
from tests.e2e.conftest import API_KEY, WEATHER
from tests.e2e.http_raw import head, hold

pytestmark = requires_default_model

HEADERS = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
TOOLS = [
    {"name": "get_weather", "description": "The weather in a city now", "input_schema": WEATHER}
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# the event types of one message, in the order Anthropic sends them
START, BLOCK_START, BLOCK_DELTA, BLOCK_STOP = (
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
)


@pytest.fixture(scope="module")
def api(served):
    with httpx.Client(base_url=served.base, headers=HEADERS, timeout=600) as client:
        yield client


def body(**extra):
    return {"model": "smol", "max_tokens": 24, "temperature": 0, "messages": ASK, **extra}


def events(client: httpx.Client, request: dict) -> list[tuple[str, dict]]:
    """A streamed answer's events: (the `event:` line's name, the data's object)."""
    out = []
    with client.stream("POST", "/v1/messages", json={**request, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                assert data["type"] == name  # the event line names the data's type
                out.append((name, data))
    return out


def check_order(evs: list[tuple[str, dict]]) -> None:
    """message_start; each block started, its deltas, stopped, in index order; message_delta;
    message_stop."""
    names = [n for n, _ in evs]
    assert names[0] == START and names[-2:] == ["message_delta", "message_stop"]
    open_index, next_index = None, 0
    for name, data in evs[1:-2]:
        if name == BLOCK_START:
            assert open_index is None and data["index"] == next_index
            open_index, next_index = data["index"], next_index + 1
        elif name == BLOCK_DELTA:
            assert data["index"] == open_index
        else:
            assert name == BLOCK_STOP and data["index"] == open_index
            open_index = None
    assert open_index is None


def streamed_content(evs: list[tuple[str, dict]]) -> list[dict]:
    """The content blocks a stream's events build (a tool_use's input from its partial JSON)."""
    blocks: list[dict] = []
    partial: dict[int, str] = {}
    for name, data in evs:
        if name == BLOCK_START:
            blocks.append(dict(data["content_block"]))
        elif name == BLOCK_DELTA:
            delta = data["delta"]
            if delta["type"] == "text_delta":
                blocks[data["index"]]["text"] += delta["text"]
            else:
                assert delta["type"] == "input_json_delta"
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
    for i, text in partial.items():
        blocks[i]["input"] = json.loads(text)
    return blocks


def anthropic_error(r: httpx.Response, status: int, field: str) -> str:
    """An error in Anthropic's shape whose message names ``field``; its message."""
    assert r.status_code == status, r.text
    got = r.json()
    assert set(got) == {"type", "error"} and got["type"] == "error"
    assert set(got["error"]) == {"type", "message"}
    kinds = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
    assert got["error"]["type"] == kinds[status]
    assert field in got["error"]["message"], got
    return got["error"]["message"]


def test_a_plain_answer_is_a_message(api):
    r = api.post("/v1/messages", json=body())
    assert r.status_code == 200, r.text
    msg = r.json()
    assert msg["id"].startswith("msg_") and msg["type"] == "message"
    assert (msg["role"], msg["model"]) == ("assistant", "smol")
    [block] = msg["content"]
    assert block["type"] == "text" and block["text"].strip()
    assert msg["stop_reason"] in ("end_turn", "max_tokens") and msg["stop_sequence"] is None
    usage = msg["usage"]
    if msg["stop_reason"] == "max_tokens":
        assert usage["output_tokens"] == 24
    else:
        assert 1 <= usage["output_tokens"] < 24
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > 5


def test_a_stream_sends_anthropics_events_in_order_with_the_same_text(api):
    whole = api.post("/v1/messages", json=body()).json()
    evs = events(api, body())
    check_order(evs)
    start = evs[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == []
    assert start["stop_reason"] is None
    assert streamed_content(evs) == whole["content"]
    delta = evs[-2][1]
    assert delta["delta"]["stop_reason"] == whole["stop_reason"]
    assert delta["delta"]["stop_sequence"] is None
    assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_max_tokens_and_a_stop_sequence_are_the_stop_reasons(api):
    r = api.post("/v1/messages", json=body(max_tokens=3)).json()
    assert r["stop_reason"] == "max_tokens" and r["usage"]["output_tokens"] == 3
    first = api.post("/v1/messages", json=body(max_tokens=24)).json()["content"][0]["text"]
    word = first.split()[1]  # a word the greedy answer writes, so it stops there
    r = api.post("/v1/messages", json=body(stop_sequences=["zzzq", word])).json()
    assert r["stop_reason"] == "stop_sequence" and r["stop_sequence"] == word
    assert word not in r["content"][0]["text"] and first.startswith(r["content"][0]["text"])
    evs = events(api, body(stop_sequences=["zzzq", word]))
    assert evs[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": word}


def call_weather(api: httpx.Client, **extra) -> dict:
    r = api.post("/v1/messages", json=body(max_tokens=80, tools=TOOLS, **extra))
    assert r.status_code == 200, r.text
    return r.json()


def test_a_tool_round_trip(api):
    msg = call_weather(api, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert msg["stop_reason"] == "tool_use"
    [use] = [b for b in msg["content"] if b["type"] == "tool_use"]
    assert use["id"].startswith("toolu_") and use["name"] == "get_weather"
    jsonschema.validate(use["input"], WEATHER)
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": "18 C and sunny"}
    turn = [
        *ASK,
        {"role": "assistant", "content": msg["content"]},
        {"role": "user", "content": [result]},
    ]
    r = api.post(
        "/v1/messages", json=body(messages=turn, tools=TOOLS, tool_choice={"type": "none"})
    )
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["stop_reason"] in ("end_turn", "max_tokens")
    assert [b["type"] for b in answer["content"]] == ["text"] and answer["content"][0]["text"]
    # the result reached the prompt: the turn with it counts more tokens than without
    shorter = [*turn[:-1], {"role": "user", "content": [{**result, "content": ""}]}]
    n = [
        api.post("/v1/messages/count_tokens", json={"model": "smol", "messages": m, "tools": TOOLS})
        for m in (turn, shorter)
    ]
    assert n[0].json()["input_tokens"] > n[1].json()["input_tokens"]


def test_a_streamed_tool_use_sends_its_input_as_json_deltas(api):
    choice = {"type": "tool", "name": "get_weather"}
    whole = call_weather(api, tool_choice=choice)
    evs = events(api, body(max_tokens=80, tools=TOOLS, tool_choice=choice))
    check_order(evs)
    starts = [d["content_block"] for n, d in evs if n == BLOCK_START]
    assert [b["type"] for b in starts] == ["tool_use"] and starts[0]["input"] == {}
    assert any(n == BLOCK_DELTA and d["delta"]["type"] == "input_json_delta" for n, d in evs)
    [use] = streamed_content(evs)
    [whole_use] = whole["content"]
    assert (use["name"], use["input"]) == (whole_use["name"], whole_use["input"])
    jsonschema.validate(use["input"], WEATHER)
    assert evs[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_count_tokens_counts_the_prompt_the_answer_ran(api):
    for extra in ({}, {"tools": TOOLS, "system": [{"type": "text", "text": "Be brief."}]}):
        counted = api.post(
            "/v1/messages/count_tokens", json={"model": "smol", "messages": ASK, **extra}
        )
        assert counted.status_code == 200, counted.text
        assert set(counted.json()) == {"input_tokens"}
        usage = api.post("/v1/messages", json=body(max_tokens=4, **extra)).json()["usage"]
        # Anthropic's input_tokens leaves out what the cache served: together, the prompt
        ran = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert counted.json()["input_tokens"] == ran


def test_the_key_is_taken_from_x_api_key_and_a_wrong_one_is_a_401(served):
    ok = httpx.post(
        served.base + "/v1/messages", json=body(max_tokens=2), headers=HEADERS, timeout=600
    )
    assert ok.status_code == 200, ok.text
    assert httpx.get(served.base + "/v1/models", headers={"x-api-key": API_KEY}).status_code == 200
    wrong = {**HEADERS, "x-api-key": "not-the-key"}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = httpx.post(served.base + path, json=body(), headers=wrong, timeout=60)
        anthropic_error(r, 401, "API key")


BAD = [
    ({"max_tokens": None}, "max_tokens"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "url", "url": "http://127.0.0.1/x.png"},
                        }
                    ],
                }
            ]
        },
        "messages.0.content.0.type",
    ),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "document"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_time"}}, "tool_choice.name"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ({"tools": [{**TOOLS[0], "name": "get weather"}]}, "tools.0.name"),
    (
        {
            "messages": [
                *ASK,
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}],
                },
            ]
        },
        "messages.1.content.0.tool_use_id",
    ),
    (
        {
            "messages": [
                *ASK,
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": "Paris",
                        }
                    ],
                },
            ]
        },
        "messages.1.content.0.input",
    ),
]


@pytest.mark.parametrize(("change", "field"), BAD, ids=[f for _, f in BAD])
def test_bad_inputs_are_400s_in_anthropics_shape_naming_the_field(api, change, field):
    request = {k: v for k, v in {**body(), **change}.items() if v is not None}
    anthropic_error(api.post("/v1/messages", json=request), 400, field)


def test_count_tokens_refuses_what_it_does_not_take(api):
    r = api.post("/v1/messages/count_tokens", json={**body(), "max_tokens": 5})
    anthropic_error(r, 400, "max_tokens")
    r = api.post("/v1/messages/count_tokens", json={"model": "other", "messages": ASK})
    anthropic_error(r, 404, "model")


def test_the_request_received_receipt_names_the_messages_api(api, served):
    msg = api.post("/v1/messages", json=body(max_tokens=2)).json()
    rid = "msg-" + msg["id"].removeprefix("msg_")  # the receipts' rid: msg-<the same hex>
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = served.log_file.read_bytes().splitlines()
        got = [json.loads(x) for x in lines if b'"request.received"' in x and rid.encode() in x]
        if got:
            break
        time.sleep(0.2)
    assert [r["api"] for r in got] == ["messages"]


def test_a_refusal_is_on_the_record_with_what_the_client_was_told(api, served):
    r = api.post("/v1/messages", json={**body(), "top_k": "3"})
    told = anthropic_error(r, 400, "top_k")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = served.log_file.read_bytes().splitlines()
        got = [json.loads(x) for x in lines if b'"request.rejected"' in x]
        got = [g for g in got if g["route"] == "/v1/messages" and g["reason"] == told]
        if got:
            break
        time.sleep(0.2)
    assert [(g["status"], g["field"]) for g in got] == [(400, "top_k")]


LONG = [{"role": "user", "content": "Count from 1 to 1000, one number a line."}]


def aborted_by_the_client(served) -> set[str]:
    lines = served.log_file.read_bytes().splitlines()
    aborts = [json.loads(x) for x in lines if b'"request.abort"' in x and b'"msg-' in x]
    return {a["rid"] for a in aborts if a["reason"] == "client_disconnect"}


def freed(api: httpx.Client) -> dict:
    """The pool once nothing runs (a leak would be forever: the limit is roomy, not waited)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        h = api.get("/health").json()
        if h["running"] == 0 and h["kv_used"] == 0:
            break
        time.sleep(0.2)
    return h


def hang_up_once_running(api: httpx.Client, port: int, request: dict) -> None:
    """Send a whole (not streamed) message on a connection of its own and close it once the
    server runs it, or once its answer comes (the model ended first: no hang-up this time).
    No clock decides it: the server's own /health and the socket do."""
    body = json.dumps(request).encode()
    keys = "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
    with hold(port, head("/v1/messages", len(body), keys) + body) as s:
        deadline = time.monotonic() + 120  # an upper bound on a wait that is short
        while time.monotonic() < deadline and not select.select([s], [], [], 0.05)[0]:
            if api.get("/health").json()["running"] > 0:
                break


@pytest.mark.parametrize("streamed", [True, False])
def test_a_client_that_goes_away_aborts_its_message_and_frees_its_memory(api, served, streamed):
    before = aborted_by_the_client(served)
    request = {"model": "smol", "max_tokens": 2000, "messages": LONG, "stream": streamed}
    # the model may end its answer before the hang-up reaches it: a few tries, each a new abort
    for _ in range(3):
        if streamed:
            with api.stream("POST", "/v1/messages", json=request) as r:
                for line in r.iter_lines():
                    if line.startswith("event: content_block_delta"):
                        break  # one delta, then hang up
        else:
            hang_up_once_running(api, served.port, request)
        h = freed(api)
        assert h["running"] == 0 and h["kv_used"] == 0, h
        if aborted_by_the_client(served) - before:
            break
    assert aborted_by_the_client(served) - before  # aborted, not run to its end


def test_the_anthropic_sdk_against_the_server(served):
    anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed")
    client = anthropic.Anthropic(base_url=served.base, api_key=API_KEY)
    msg = client.messages.create(model="smol", max_tokens=16, messages=ASK)
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens")
    counted = client.messages.count_tokens(model="smol", messages=ASK).input_tokens
    assert counted == msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    image = {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/a.png"}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="smol", max_tokens=4, messages=[{"role": "user", "content": [image]}]
        )
    assert "messages.0.content.0.type" in refused.value.message
    with client.messages.stream(
        model="smol",
        max_tokens=80,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ) as s:
        final = s.get_final_message()
    [use] = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(use.input, WEATHER)
    assert final.stop_reason == "tool_use"
