"""The Responses API's answer from the chat route's deltas: the items and the stream's typed
events in OpenAI's order (``Output``), and a Responses input read as the chat it stands for
(``chat_messages``, ``input_items``)."""

from __future__ import annotations

import pytest

from engine.server.errors import ProtocolError
from engine.server.responses_api import (
    Output,
    as_chat,
    chat_body,
    chat_messages,
    input_items,
    parse_request,
)


def test_text_deltas_open_a_message_and_its_part_then_close_them_in_order():
    out = Output()
    events = out.feed({"content": "Hel"}) + out.feed(None) + out.feed({"content": "lo"})
    events += out.finish("completed")
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert events[0]["item"]["status"] == "in_progress" and events[0]["item"]["content"] == []
    assert events[4]["text"] == "Hello" and events[5]["part"]["text"] == "Hello"
    assert events[-1]["item"]["status"] == "completed"
    (item,) = out.items
    assert item["content"] == [{"type": "output_text", "text": "Hello", "annotations": []}]
    assert {e["item_id"] for e in events[1:6]} == {item["id"]}


def test_calls_are_items_of_their_own_after_the_text_each_closed_before_the_next():
    out = Output()
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    args = {"index": 0, "function": {"arguments": '{"a": 1}'}}
    second = {**call, "index": 1, "id": "call_2"}
    events = out.feed({"content": "Sure."}) + out.feed({"tool_calls": [call]})
    events += out.feed({"tool_calls": [args]}) + out.feed({"tool_calls": [second]})
    events += out.finish("completed")
    kinds = [e["type"] for e in events]
    assert kinds[kinds.index("response.output_item.done") + 1 :] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [i["type"] for i in out.items] == ["message", "function_call", "function_call"]
    assert out.items[1]["arguments"] == '{"a": 1}' and out.items[1]["call_id"] == "call_1"
    assert [e["output_index"] for e in events if e["type"].endswith("item.done")] == [0, 1, 2]


def test_an_answer_of_nothing_is_one_empty_message_cut_short_when_incomplete():
    out = Output()
    events = out.finish("incomplete")
    assert [i["status"] for i in out.items] == ["incomplete"]
    assert events[-1]["item"]["content"][0]["text"] == ""


def test_items_read_as_a_chat_calls_joined_to_the_answer_before_them():
    items = input_items(
        [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "message", "role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sun"},
        ]
    )
    assert [i["id"][:3] for i in items] == ["msg", "msg", "fc_", "fc_", "fco"]
    messages = chat_messages(items, 0)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "Checking."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "sun"}


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ([{"type": "function_call_output", "call_id": "x", "output": "1"}], "input.0.call_id"),
        (
            [{"type": "function_call", "call_id": "x", "name": "f", "arguments": "[1]"}],
            "input.0.arguments",
        ),
        ([{"type": "reasoning", "summary": []}], "input.0.type"),
        (
            [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
            "input.0.content.0.type",
        ),
        (["hello"], "input.0"),
    ],
)
def test_what_this_server_does_not_serve_is_refused_by_its_place(raw, param):
    with pytest.raises(ProtocolError) as e:
        chat_messages(input_items(raw), 0)
    assert e.value.param == param and param in str(e.value)


def test_a_request_reads_as_the_chat_it_stands_for():
    req = parse_request(
        {
            "model": "smol",
            "input": "Weather in Oslo?",
            "instructions": "Be brief.",
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "w"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "max_output_tokens": 9,
            "parallel_tool_calls": False,
            "service_tier": "auto",  # asks for nothing here: accepted, unused
        },
        "smol",
    )
    chat = as_chat(chat_body(req, [], input_items(req.input)))
    assert [(m.role, m.content) for m in chat.messages] == [
        ("system", "Be brief."),
        ("user", "Weather in Oslo?"),
    ]
    assert chat.tools[0].function.name == "w" and chat.tool_choice.function.name == "w"
    assert chat.response_format.type == "json_schema"
    assert chat.response_format.json_schema.schema_ == {"type": "object"}
    assert chat.max_tokens == 9 and chat.parallel_tool_calls is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning"),
        ({"input": "x", "include": ["file_search_call.results"]}, "include"),
        ({"input": "x", "model": "gpt-4o"}, "model"),
        ({"input": "x", "metadata": {"k": "v" * 513}}, "metadata"),
    ],
)
def test_fields_asking_for_what_is_not_served_are_refused_by_name(body, param):
    with pytest.raises(ProtocolError) as e:
        parse_request(body, "smol")
    assert e.value.param == param, str(e.value)
