"""The scheduler hands the sampler each request's generated tokens: a penalty changes a greedy
run exactly where the unpenalised run repeats itself, and not before; a logit bias steers every
token; a request that sets neither is token-identical to plain greedy in the same batch."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

PROMPT = [5, 6, 7, 8]
GREEDY = {"max_tokens": 20, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    engine = LLM(model=tiny_model_dir, kv_tokens=512, check_invariants=True)
    yield engine
    engine.close()


def first_repeat(tokens: list[int]) -> int:
    return next(i for i, t in enumerate(tokens) if t in tokens[:i])


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0}])
def test_a_penalty_changes_a_greedy_run_where_it_would_repeat_and_not_before(llm, penalty):
    plain, penalised = llm.generate(
        [PROMPT, PROMPT], [SamplingParams(**GREEDY), SamplingParams(**GREEDY, **penalty)]
    )
    k = first_repeat(plain.token_ids)  # the tiny model's greedy run repeats itself
    # before the first repeat, the argmax was never generated: the penalty cannot move it
    assert penalised.token_ids[:k] == plain.token_ids[:k]
    assert penalised.token_ids != plain.token_ids


def test_a_repetition_penalty_changes_a_greedy_run_and_counts_the_prompt(llm):
    """vLLM's repetition penalty: the prompt's tokens count as seen, so a run that would repeat
    one of them (or itself) takes another course; 1 is plain greedy."""
    plain, penalised, off = llm.generate(
        [PROMPT] * 3,
        [
            SamplingParams(**GREEDY),
            SamplingParams(**GREEDY, repetition_penalty=3.0),
            SamplingParams(**GREEDY, repetition_penalty=1.0),
        ],
    )
    assert off.token_ids == plain.token_ids
    assert penalised.token_ids != plain.token_ids


def test_a_logit_bias_steers_every_token_and_leaves_its_batch_mates_alone(llm):
    alone = llm.generate([PROMPT], SamplingParams(**GREEDY))[0]
    biased, plain = llm.generate(
        [PROMPT, PROMPT],
        [SamplingParams(**GREEDY, logit_bias={7: 100.0}), SamplingParams(**GREEDY)],
    )
    assert biased.token_ids == [7] * 20
    assert plain.token_ids == alone.token_ids  # unset: the exact greedy path
