"""Tool calling's plan and parsers: what a request's tools and tool_choice hold the output to
(checked with jsonschema, and compiled by xgrammar over a tiny vocabulary), how earlier calls
and tool results are written back into the prompt, and how calls are read out of the output as
it streams (the merged deltas are the whole answer, whatever the deltas' sizes)."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from engine.guided.compiler import Grammars
from engine.guided.tool_parsers import GenericParser, HermesParser, merged
from engine.guided.tools import generic_history, generic_schema, history, plan_of, tools_of
from engine.model.chat import tool_turns
from engine.model.tokenizer import Tokenizer
from engine.observability.receipts import Receipts
from engine.request.guide import GuideError
from tests.tiny_model import EOS, VOCAB, train_tokenizer


def fn(name: str, params: dict | None = None) -> dict:
    f = {"name": name, "description": f"the {name} tool"}
    if params is not None:
        f["parameters"] = params
    return {"type": "function", "function": f}


WEATHER = fn(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
    },
)
# a pydantic-made schema: its nested model is a reference into its own $defs
BOOK = fn(
    "book",
    {
        "$defs": {
            "Seat": {
                "type": "object",
                "properties": {"row": {"type": "integer", "minimum": 1}},
                "required": ["row"],
            }
        },
        "type": "object",
        "properties": {"seat": {"$ref": "#/$defs/Seat"}},
        "required": ["seat"],
    },
)
NOW = fn("now")  # no parameters: no arguments
TOOLS = [WEATHER, BOOK, NOW]
CALL_W = {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}
CALL_B = {"name": "book", "arguments": {"seat": {"row": 3}}}


def valid(schema: dict, instance: object) -> bool:
    return Draft202012Validator(schema).is_valid(instance)


def test_auto_takes_a_valid_call_or_an_answer_and_nothing_else():
    s = generic_schema(tools_of(TOOLS), "auto", None, True)
    assert valid(s, {"tool_calls": [CALL_W, CALL_B]})
    assert valid(s, {"tool_calls": [{"name": "now", "arguments": {}}]})
    assert valid(s, {"content": "hello"})
    assert not valid(s, {"tool_calls": []})
    assert not valid(s, {"tool_calls": [{"name": "nope", "arguments": {}}]})
    assert not valid(s, {"tool_calls": [{**CALL_W, "arguments": {"city": "Oslo", "unit": "k"}}]})
    # the moved reference still holds the nested model to its own schema
    assert not valid(s, {"tool_calls": [{"name": "book", "arguments": {"seat": {"row": 0}}}]})


def test_required_named_and_one_at_a_time_narrow_the_output():
    specs = tools_of(TOOLS)
    required = generic_schema(specs, "required", None, True)
    assert not valid(required, {"content": "hello"})
    assert valid(required, {"tool_calls": [CALL_W, CALL_B]})
    one = generic_schema(specs, "required", None, False)
    assert valid(one, {"tool_calls": [CALL_W]}) and not valid(one, {"tool_calls": [CALL_W, CALL_B]})
    named = generic_schema(specs, "named", "book", True)
    assert valid(named, {"tool_calls": [CALL_B]})
    assert not valid(named, {"tool_calls": [CALL_W]})


@pytest.mark.parametrize(
    ("tools", "choice", "param", "words"),
    [
        ([], "required", "tool_choice", "needs tools"),
        (
            TOOLS,
            {"type": "function", "function": {"name": "fly"}},
            "tool_choice.function.name",
            "not one of the tools",
        ),
        ([WEATHER, WEATHER], None, "tools.1", "names two tools"),
        (
            [fn("f", {"type": "object", "uniqueItems": True})],
            None,
            "tools.0.function.parameters.uniqueItems",
            "not supported",
        ),
        ([fn("f", {"type": "frob"})], None, "tools.0.function.parameters.type", "not a valid"),
    ],
)
def test_a_plan_that_cannot_be_honoured_names_the_field(tools, choice, param, words):
    with pytest.raises(GuideError) as e:
        plan_of(tools, choice, True, native=False)
    assert e.value.param == param and words in str(e.value)


def test_no_tools_or_none_plans_a_plain_answer():
    assert plan_of(None, None, True, native=False) is None
    assert plan_of(None, "none", True, native=False) is None
    plan = plan_of(TOOLS, "none", True, native=False)
    assert plan is not None and not plan.active and plan.guide is None
    chat = [{"role": "user", "content": "hi"}]
    assert plan.messages(chat) == chat  # the tools are not described when none may be called


def test_the_generic_format_describes_the_tools_in_the_system_message():
    plan = plan_of(TOOLS, "auto", True, native=False)
    out = plan.messages(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    )
    assert [m["role"] for m in out] == ["system", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n") and '"get_weather"' in out[0]["content"]
    alone = plan.messages([{"role": "user", "content": "hi"}])
    assert alone[0]["role"] == "system" and alone[1] == {"role": "user", "content": "hi"}
    assert plan.guide.kind == "json_schema" and plan.template_tools() is None


def test_earlier_calls_and_their_results_are_written_back_as_the_format_has_them():
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Oslo", "unit": "c"}',
                    },
                },
                {"id": "c2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
    ]
    out = generic_history(history)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert json.loads(out[1]["content"]) == {
        "tool_calls": [CALL_W, {"name": "now", "arguments": {}}]
    }
    assert json.loads(out[2]["content"]) == {
        "tool_results": [
            {"name": "get_weather", "content": "4 C"},
            {"name": "now", "content": "noon"},
        ]
    }
    bad = [
        {
            **history[1],
            "tool_calls": [
                {**history[1]["tool_calls"][0], "function": {"name": "now", "arguments": "[1]"}}
            ],
        }
    ]
    with pytest.raises(GuideError) as e:
        generic_history(bad)
    assert e.value.param == "messages.0.tool_calls.0.function.arguments"


# a turn that called a tool, and the tool's result
CALLED = [
    {"role": "user", "content": "time?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "now", "arguments": '{"tz": "UTC"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "noon"},
]


def test_a_history_with_calls_keeps_them_when_this_turn_sends_no_tools():
    assert plan_of(None, None, True, native=False) is None
    out = history(CALLED, native=False)
    want = {"tool_calls": [{"name": "now", "arguments": {"tz": "UTC"}}]}
    assert json.loads(out[1]["content"]) == want
    assert out[2]["role"] == "user" and "noon" in out[2]["content"]
    native = history(CALLED, native=True)
    assert native[1]["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"}


def feed(parser, text: str, step: int):
    deltas = []
    for k in range(0, len(text), step):
        deltas += parser.feed(text[k : k + step])
    more, reason = parser.finish("stop")
    return deltas + more, reason


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_generic_calls_stream_as_openai_deltas_whatever_the_deltas_sizes(step):
    text = json.dumps({"tool_calls": [CALL_W, CALL_B]})
    deltas, reason = feed(GenericParser(), text, step)
    content, calls = merged(deltas)
    assert reason == "tool_calls" and content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (c["name"], c["arguments"]) for c in (CALL_W, CALL_B)
    ]
    assert len({c["id"] for c in calls}) == 2 and all(c["id"].startswith("call_") for c in calls)
    first = [d for d in deltas if "tool_calls" in d][0]["tool_calls"][0]
    assert first["function"] == {"name": "get_weather", "arguments": ""} and first["index"] == 0


def test_a_generic_answer_streams_its_text_as_it_grows():
    text = json.dumps({"content": 'héllo "world" \\ done'}, ensure_ascii=True)
    parser = GenericParser()
    pieces = [d["content"] for k in range(len(text)) for d in parser.feed(text[k])]
    more, reason = parser.finish("stop")
    assert reason == "stop" and more == []
    assert "".join(pieces) == 'héllo "world" \\ done' and len(pieces) > 5


def test_a_generic_call_is_announced_before_its_arguments_are_whole():
    parser = GenericParser()
    early = parser.feed('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Os')
    assert [d["tool_calls"][0]["function"] for d in early] == [
        {"name": "get_weather", "arguments": ""}
    ]
    later = parser.feed('lo", "unit": "c"}}]}')
    assert later == []  # the last call's arguments are whole only when the output ends
    more, _ = parser.finish("stop")
    assert json.loads(more[0]["tool_calls"][0]["function"]["arguments"]) == CALL_W["arguments"]


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_hermes_blocks_are_calls_and_the_rest_is_content(step):
    text = (
        'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
        '"unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n'
        "</tool_call>"
    )
    deltas, reason = feed(HermesParser(), text, step)
    content, calls = merged(deltas)
    assert reason == "tool_calls" and content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0]["function"]["arguments"]) == CALL_W["arguments"]


def test_hermes_holds_back_what_may_open_a_block_and_keeps_a_broken_block_as_text():
    parser = HermesParser()
    assert parser.feed("Hi <tool") == [{"content": "Hi "}]
    assert parser.feed("box>") == [{"content": "<toolbox>"}]
    deltas, reason = feed(HermesParser(), "<tool_call>\nnot json\n</tool_call>", 2)
    assert merged(deltas) == ("<tool_call>\nnot json\n</tool_call>", []) and reason == "stop"


@pytest.fixture(scope="module")
def grammars():
    tok = Tokenizer(
        train_tokenizer(), bos_id=0, eos_id=EOS, stop_ids={EOS}, add_bos=False, chat_template=None
    )
    return Grammars(tok, VOCAB, Receipts(capture=True), timeout_s=30.0)


def accepts(grammars, guide, text: str) -> bool:
    m = xgr.GrammarMatcher(grammars.compiled(guide))
    return m.accept_string(text) and m.is_completed()


def test_the_generic_guide_compiles_and_holds_the_output_to_the_tools(grammars):
    guide = plan_of(TOOLS, "auto", True, native=False).guide
    good = json.dumps({"tool_calls": [CALL_W, CALL_B]})  # the separators xgrammar writes
    assert accepts(grammars, guide, good)
    assert accepts(grammars, guide, '{"content": "hi"}')
    assert not accepts(grammars, guide, good.replace('"c"', '"k"'))
    assert not accepts(grammars, guide, good.replace('"row": 3', '"row": 0'))


def test_a_hermes_model_that_must_call_writes_blocks_of_the_named_tools(grammars):
    plan = plan_of(TOOLS, "required", True, native=True)
    assert (
        plan.guide.kind == "tagged_json"
        and plan.template_tools()[0]["function"]["name"] == "get_weather"
    )
    call = json.dumps(CALL_W)
    block = f"<tool_call>\n{call}\n</tool_call>"
    assert accepts(grammars, plan.guide, block)
    assert accepts(grammars, plan.guide, block + "\n" + block)
    assert not accepts(grammars, plan.guide, "Sure. " + block)
    one = plan_of(TOOLS, "required", False, native=True).guide
    assert accepts(grammars, one, block) and not accepts(grammars, one, block + "\n" + block)
    named = plan_of(TOOLS, {"type": "function", "function": {"name": "now"}}, True, native=True)
    now = json.dumps({"name": "now", "arguments": {}})
    assert accepts(grammars, named.guide, f"<tool_call>\n{now}\n</tool_call>")
    assert not accepts(grammars, named.guide, block)
    assert plan_of(TOOLS, "auto", True, native=True).guide is None  # auto: read, not held


# Messages as a chat request's ``model_dump(exclude_none=True)`` gives them: any role, text, and
# now and then the keys that make a turn a tool turn.
_TURN = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": st.text()},
    optional={
        "tool_calls": st.just(
            [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]
        ),
        "tool_call_id": st.just("c1"),
        "name": st.text(min_size=1, max_size=8),
    },
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_TURN, min_size=1, max_size=6), st.booleans())
def test_a_chat_without_tool_turns_needs_no_history_translation(messages, native):
    """The chat path skips ``history`` where ``tool_turns`` says a chat has none: there the
    translation must be the identity, for both kinds of template."""
    if tool_turns(messages):
        return
    assert history(messages, native) == messages


def test_tool_turns_sees_calls_results_and_their_ids():
    assert not tool_turns(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    )
    assert tool_turns(CALLED)
    assert tool_turns([{"role": "tool", "content": "12", "tool_call_id": "c1"}])
    assert tool_turns([{"role": "assistant", "content": "", "tool_calls": []}])
