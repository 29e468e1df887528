"""Speculative decoding (prompt lookup, ``speculative="ngram"``) changes nothing but timing: the
same greedy tokens as one token a step, from a roomy pool and from a tight one where pressure
retracts and drafts are cut (``spec.cut``); the ledger checked after every step (a rejected
draft's KV must go back the same step); drafts only for requests whose next token is the argmax.

The prompts repeat a short random segment, so prompt lookup finds something to propose; the tiny
random model agrees with some of it (accepted > 0 is asserted, not assumed)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from engine import LLM, SamplingParams
from tests.integration.test_pressure import three_at_once


def repetitive(vocab: int, n: int = 24, seed: int = 0):
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        segment = [rng.randrange(2, vocab) for _ in range(rng.randint(3, 12))]
        prompts.append((segment * rng.randint(2, 6))[:120])
    params = [SamplingParams(max_tokens=rng.randint(8, 60), temperature=0, ignore_eos=True)
              for _ in prompts]  # fmt: skip
    return prompts, params


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    prompts, params = repetitive(320)
    llm = LLM(model=tiny_model_dir, kv_tokens=16384, chunk_tokens=4096, check_invariants=True)
    out = [o.token_ids for o in llm.generate(prompts, params)]
    llm.close()
    return prompts, params, out


def spec_totals(llm) -> tuple[int, int]:
    fin = llm.core.receipts.of("request.finish")
    return (
        sum(r.get("spec_proposed", 0) for r in fin),
        sum(r.get("spec_accepted", 0) for r in fin),
    )


def test_drafts_change_no_token_in_a_roomy_pool(tiny_model_dir, plain):
    prompts, params, expected = plain
    llm = LLM(model=tiny_model_dir, kv_tokens=16384, check_invariants=True, speculative="ngram",
              spec_tokens=4)  # fmt: skip
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    proposed, accepted = spec_totals(llm)
    assert proposed > accepted > 0
    its = llm.core.receipts.of("iteration")
    assert sum(r.get("spec_accepted", 0) for r in its) <= accepted  # since each last receipt
    assert not llm.core.receipts.of("spec.cut")
    llm.close()


@pytest.mark.parametrize("page_size", [1, 4])
def test_under_pressure_drafts_are_cut_never_funded_by_relief_and_change_nothing(
    tiny_model_dir, plain, page_size
):
    prompts, params, expected = plain
    llm = LLM(model=tiny_model_dir, kv_tokens=three_at_once(prompts, params), chunk_tokens=32,
              max_running=8, page_size=page_size, check_invariants=True, speculative="ngram",
              spec_tokens=4)  # fmt: skip
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    kinds = Counter(r["event"] for r in llm.core.receipts.records)
    assert kinds["retract"] > 0 and kinds["spec.cut"] > 0 and kinds["alloc.oom"] == 0
    for cut in llm.core.receipts.of("spec.cut"):
        assert 0 <= cut["got"] < cut["want"] <= 4
    assert spec_totals(llm)[1] > 0
    llm.close()


def test_only_requests_whose_next_token_is_the_argmax_are_drafted(tiny_model_dir, plain):
    prompts, _, _ = plain
    llm = LLM(model=tiny_model_dir, kv_tokens=16384, speculative="ngram", check_invariants=True)
    kinds = [
        SamplingParams(max_tokens=30, temperature=0.8, seed=1, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0, logprobs=1, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0, presence_penalty=0.5, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0, min_tokens=30),
        SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
    ]
    llm.generate([prompts[0]] * len(kinds), kinds)
    drafted = [r.get("spec_proposed", 0) for r in llm.core.receipts.of("request.finish")]
    assert drafted[:4] == [0, 0, 0, 0] and drafted[4] > 0, drafted
    llm.close()


def test_a_request_that_stops_inside_its_drafts_ends_where_it_would_have(tiny_model_dir, plain):
    prompts, params, expected = plain
    # each request stops at a token from the middle of its plain output
    stops = [SamplingParams(max_tokens=p.max_tokens, temperature=0, stop_token_ids=[out[len(out) // 2]])
             for p, out in zip(params, expected)]  # fmt: skip
    ref = LLM(model=tiny_model_dir, kv_tokens=16384, check_invariants=True)
    want = [(o.token_ids, o.text) for o in ref.generate(prompts, stops)]
    ref.close()
    llm = LLM(model=tiny_model_dir, kv_tokens=16384, check_invariants=True, speculative="ngram")
    assert [(o.token_ids, o.text) for o in llm.generate(prompts, stops)] == want
    llm.close()
