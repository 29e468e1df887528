"""Constrained decoding in the engine: a random tiny model, whose free output is noise, writes
JSON that validates against the schema it was given, text that matches a pattern, one of the
choices; in a batch with unconstrained requests, which stay token-identical to running alone.
Each constrained request's matcher has taken exactly its output (the invariant checks run after
every step), through retraction too."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import LLM, SamplingParams
from engine.request.guide import Guide, choice_guide, json_schema_guide, text_guide

PROMPT = [5, 6, 7, 8]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    engine = LLM(model=tiny_model_dir, kv_tokens=2048, check_invariants=True)
    yield engine
    engine.close()


def guided(guide: Guide, **kw) -> SamplingParams:
    return SamplingParams(**({"max_tokens": 200, "temperature": 1.0} | kw), guide=guide)


def test_a_schema_guided_run_writes_json_that_validates(llm):
    guide = json_schema_guide(SCHEMA, strict=True, param="schema")
    outs = llm.generate([PROMPT] * 4, [guided(guide, seed=s) for s in range(4)])
    for out in outs:
        assert out.finish_reason == "stop", out.text  # the grammar ended it, not max_tokens
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_json_object_regex_and_choice(llm):
    obj, rx, pick = llm.generate(
        [PROMPT] * 3,
        [
            guided(Guide("json_object"), seed=1, max_tokens=300, temperature=0.7),
            guided(text_guide("regex", r"[0-9]{3}-[a-z]{2,4}", "regex"), seed=2),
            guided(choice_guide(["left", "right", "up"], "choice"), seed=3),
        ],
    )
    if obj.finish_reason == "stop":  # a random model may nest until max_tokens cuts it
        assert isinstance(json.loads(obj.text), dict)
    else:
        assert obj.text.startswith("{")
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", rx.text), rx.text
    assert pick.text in ("left", "right", "up")


def test_unconstrained_batch_mates_are_untouched(llm):
    greedy = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    alone = llm.generate([PROMPT], greedy)[0]
    guide = json_schema_guide(SCHEMA, strict=True, param="schema")
    outs = llm.generate([PROMPT, PROMPT, PROMPT], [guided(guide, seed=1), greedy, guided(guide)])
    assert outs[1].token_ids == alone.token_ids
    for out in (outs[0], outs[2]):
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_a_guide_that_does_not_compile_is_refused_before_the_request_exists(llm):
    sched = llm.core.scheduler
    before = dict(llm.core.receipts.counts)
    with pytest.raises(ValueError, match="does not compile"):
        sched.add_request(PROMPT, guided(text_guide("regex", "a(b", "regex")))
    counts = llm.core.receipts.counts
    assert counts.get("request.received", 0) == before.get("request.received", 0)
    assert counts["grammar.compile"] == before.get("grammar.compile", 0) + 1
    assert not sched.has_work()


def test_a_retracted_constrained_request_resumes_its_grammar_where_it_was(tiny_model_dir):
    """Under a pool that holds about three requests, constrained requests are retracted and
    re-prefilled: each keeps its output and so its matcher's state, and ends as the same
    seeded run ends with room to spare (a matcher that lost its state on the way would forbid
    the next token it is asked to take, or let through one that breaks the pattern)."""
    from tests.integration.test_pressure import roomy_and_tight, workload

    prompts, _ = workload(300, n=12, seed=4)
    pattern = r"[a-z]{30,40}\.[0-9]{5}"
    regex = text_guide("regex", pattern, "regex")
    params = [guided(regex, seed=i, max_tokens=48) for i in range(len(prompts))]
    expected, got, tight = roomy_and_tight(tiny_model_dir, prompts, params)
    assert tight.core.receipts.of("retract")  # the mechanism ran
    assert got == expected
    for tokens in got:
        assert re.fullmatch(pattern, tight.tokenizer.decode(tokens))
