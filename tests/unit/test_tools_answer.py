"""Tools and an answer format together (``response_format`` or ``structured_outputs`` beside
``tools``): with ``tool_choice`` auto the output is held to the alternation, a call or the answer
in its format; ``required`` and a named function hold it to calls only; ``none`` to the answer
only. Both tool formats (generic, hermes), each mode, compiled and matched; and the read-back: a
generic answer is the answer's own JSON text as the message content, streamed or whole."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from engine.guided.compiler import Grammars
from engine.guided.tool_parsers import merged, parser_for
from engine.guided.tools import plan_of
from engine.model.tokenizer import Tokenizer
from engine.observability.receipts import Receipts
from engine.request.guide import Guide, json_schema_guide, text_guide
from tests.tiny_model import EOS, VOCAB, train_tokenizer
from tests.unit.test_tools import CALL_W, TOOLS

ANSWER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp": {"type": "integer"}},
    "required": ["city", "temp"],
    "additionalProperties": False,
}
SCHEMA = json_schema_guide(ANSWER, True, "response_format.json_schema.schema")
GOOD = json.dumps({"city": "Oslo", "temp": 3})
CALL = json.dumps({"tool_calls": [CALL_W]})
BLOCK = f"<tool_call>\n{json.dumps(CALL_W)}\n</tool_call>"
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def grammars():
    tok = Tokenizer(
        train_tokenizer(), bos_id=0, eos_id=EOS, stop_ids={EOS}, add_bos=False, chat_template=None
    )
    return Grammars(tok, VOCAB, Receipts(capture=True), timeout_s=30.0)


def accepts(grammars, guide, text: str) -> bool:
    m = xgr.GrammarMatcher(grammars.compiled(guide))
    return m.accept_string(text) and m.is_completed()


@pytest.mark.parametrize("native", [False, True])
def test_auto_with_a_schema_takes_a_call_or_the_answer_and_nothing_else(grammars, native):
    plan = plan_of(TOOLS, "auto", True, native=native, answer=SCHEMA)
    assert plan.guide.kind == "alternation" and plan.active
    call = BLOCK if native else CALL
    assert accepts(grammars, plan.guide, call)
    assert accepts(grammars, plan.guide, GOOD)
    assert not accepts(grammars, plan.guide, '{"content": "hi"}')  # the answer is the schema's
    assert not accepts(grammars, plan.guide, json.dumps({"city": "Oslo"}))
    assert not accepts(grammars, plan.guide, "It is cold.")
    assert not accepts(grammars, plan.guide, call.replace('"c"', '"k"'))


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("choice", ["required", NAMED])
def test_required_and_named_with_a_schema_are_calls_only(grammars, native, choice):
    plan = plan_of(TOOLS, choice, True, native=native, answer=SCHEMA)
    assert plan.guide == plan_of(TOOLS, choice, True, native=native).guide  # the schema: no part
    assert accepts(grammars, plan.guide, BLOCK if native else CALL)
    assert not accepts(grammars, plan.guide, GOOD)


@pytest.mark.parametrize("native", [False, True])
def test_none_with_a_schema_is_the_schema_only(native):
    plan = plan_of(TOOLS, "none", True, native=native, answer=SCHEMA)
    assert not plan.active and plan.guide == SCHEMA


def test_any_answer_format_joins_the_alternation(grammars):
    regex = text_guide("regex", r"[0-9]{3}", "structured_outputs.regex")
    plan = plan_of(TOOLS, "auto", False, native=False, answer=regex)
    assert accepts(grammars, plan.guide, "123") and accepts(grammars, plan.guide, CALL)
    assert not accepts(grammars, plan.guide, json.dumps({"tool_calls": [CALL_W, CALL_W]}))
    obj = plan_of(TOOLS, "auto", True, native=False, answer=Guide("json_object"))
    assert accepts(grammars, obj.guide, GOOD) and not accepts(grammars, obj.guide, "[1]")


def test_the_alternation_receipt_names_its_kind(grammars):
    plan = plan_of(TOOLS, "auto", True, native=False, answer=SCHEMA)
    grammars.compiled(plan.guide)
    [receipt] = [
        r for r in grammars.receipts.of("grammar.compile") if r["guide"] == plan.guide.digest
    ]
    assert receipt["kind"] == "alternation" and receipt["outcome"] == "ok"


def read(plan, text: str, step: int):
    parser = parser_for(plan)
    deltas = [d for k in range(0, len(text), step) for d in parser.feed(text[k : k + step])]
    more, reason = parser.finish("stop")
    return deltas + more, reason


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_a_generic_answer_in_the_schema_reads_back_as_its_json_text(step):
    plan = plan_of(TOOLS, "auto", True, native=False, answer=SCHEMA)
    deltas, reason = read(plan, GOOD, step)
    assert merged(deltas) == (GOOD, []) and reason == "stop"
    if step == 1:  # it streams as it is written, not held to the end
        assert len([d for d in deltas if "content" in d]) > 5
    deltas, reason = read(plan, CALL, step)
    content, calls = merged(deltas)
    assert content is None and reason == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (CALL_W["name"], CALL_W["arguments"])
    ]


@pytest.mark.parametrize("step", [1, 1000])
def test_a_hermes_answer_in_the_schema_is_the_content(step):
    plan = plan_of(TOOLS, "auto", True, native=True, answer=SCHEMA)
    assert merged(read(plan, GOOD, step)[0]) == (GOOD, [])
    content, calls = merged(read(plan, BLOCK, step)[0])
    assert content is None and calls[0]["function"]["name"] == "get_weather"


def test_a_generic_output_cut_before_it_shows_its_branch_is_its_text():
    plan = plan_of(TOOLS, "auto", True, native=False, answer=SCHEMA)
    parser = parser_for(plan)
    assert parser.feed('{"to') == []  # a call or an answer: not known yet
    assert parser.finish("length") == ([{"content": '{"to'}], "length")
    # calls only (required): a cut call is no answer, as without an answer format
    required = parser_for(plan_of(TOOLS, "required", True, native=False, answer=SCHEMA))
    assert required.feed('{"tool_calls": [{"na') == []
    assert required.finish("length") == ([], "length")
