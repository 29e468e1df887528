"""Tools and an answer schema in the engine: a random tiny model, whose free output is noise,
held to the generic format's alternation, writes either a valid call of one of the tools or an
answer that validates against the schema, and nothing else; the read-back takes each for what
it is (the calls as calls, the answer's JSON text as the content). Among sixteen seeds both
happen: neither branch of the alternation is lost."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine import LLM, SamplingParams
from engine.guided.tool_parsers import merged, parser_for
from engine.guided.tools import generic_schema, plan_of, tools_of
from engine.request.guide import json_schema_guide

PROMPT = [5, 6, 7, 8]
# its first key shares the calls' first letter: the model's choice between the two is made at a
# letter it has no preference for, so both happen among a few seeds
ANSWER = {
    "type": "object",
    "properties": {
        "temp": {"type": "integer", "minimum": -50, "maximum": 50},
        "city": {"type": "string", "maxLength": 8},
    },
    "required": ["temp", "city"],
    "additionalProperties": False,
}
TIMER = {
    "type": "object",
    "properties": {"minutes": {"type": "integer", "minimum": 1, "maximum": 120}},
    "required": ["minutes"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "set_timer", "parameters": TIMER}},
    {"type": "function", "function": {"name": "now"}},
]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    engine = LLM(model=tiny_model_dir, kv_tokens=2048, check_invariants=True)
    yield engine
    engine.close()


def test_the_alternation_writes_a_valid_call_or_a_valid_answer(llm):
    answer = json_schema_guide(ANSWER, True, "response_format.json_schema.schema")
    plan = plan_of(TOOLS, "auto", False, native=False, answer=answer)
    calls = generic_schema(tools_of(TOOLS), "required", None, False)
    params = [
        SamplingParams(max_tokens=160, temperature=1.0, seed=s, guide=plan.guide) for s in range(16)
    ]
    seen = set()
    for out in llm.generate([PROMPT] * len(params), params):
        assert out.finish_reason == "stop", out.text  # the grammar ended it
        value = json.loads(out.text)
        parser = parser_for(plan)
        deltas = parser.feed(out.text)
        more, reason = parser.finish(out.finish_reason)
        content, called = merged(deltas + more)
        if "tool_calls" in value:
            jsonschema.validate(value, calls)
            assert reason == "tool_calls" and content is None
            assert [c["function"]["name"] for c in called] == [value["tool_calls"][0]["name"]]
            seen.add("call")
        else:
            jsonschema.validate(value, ANSWER)
            assert content == out.text and called == [] and reason == "stop"
            seen.add("answer")
    assert seen == {"call", "answer"}
