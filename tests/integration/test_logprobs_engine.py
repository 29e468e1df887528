"""Logprobs from the engine: each sampled token's log-probability and the most likely tokens',
in the distribution the sampler drew from before temperature and the filters: after the grammar
mask (a forbidden token is -inf and never among the most likely), the logit bias and the
penalties. Only requests that ask pay for them."""

from __future__ import annotations

import math

import pytest
import torch

from engine import LLM, SamplingParams
from engine.request.guide import choice_guide

PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    engine = LLM(model=tiny_model_dir, kv_tokens=1024, check_invariants=True)
    yield engine
    engine.close()


def test_a_greedy_runs_logprobs_are_the_models_own_and_its_tokens_the_most_likely(llm):
    greedy = dict(max_tokens=8, temperature=0, ignore_eos=True)
    out, plain = llm.generate(
        [PROMPT, PROMPT], [SamplingParams(**greedy, logprobs=3), SamplingParams(**greedy)]
    )
    assert plain.logprobs is None and out.token_ids == plain.token_ids  # asking changes nothing
    assert [t for t, _, _ in out.logprobs] == out.token_ids
    first = llm.core.sequence_logits(PROMPT)[-1]  # the model's logits after the prompt
    expected = torch.log_softmax(first, -1)
    token, lp, top = out.logprobs[0]
    assert lp == pytest.approx(float(expected[token]), abs=1e-4)
    for token, lp, top in out.logprobs:
        assert len(top) == 3 and top[0] == (token, pytest.approx(lp))  # greedy: the argmax
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)


def test_logprobs_are_after_the_bias_and_the_grammar_mask(llm):
    biased = SamplingParams(
        max_tokens=4, temperature=1.0, seed=1, logit_bias={7: 100.0}, logprobs=1, ignore_eos=True
    )
    [out] = llm.generate([PROMPT], biased)
    assert all(t == 7 and lp > -1e-3 for t, lp, _ in out.logprobs)
    guide = choice_guide(["left", "right"], "c")
    [out] = llm.generate([PROMPT], SamplingParams(max_tokens=8, guide=guide, seed=2, logprobs=5))
    tok = llm.tokenizer
    for _, lp, top in out.logprobs:
        assert math.isfinite(lp)
        allowed = [(t, v) for t, v in top if math.isfinite(v)]
        assert allowed and all(v == -math.inf for t, v in top[len(allowed) :])
    # the first token: only a start of "left" or "right" has a finite logprob
    _, _, top = out.logprobs[0]
    starts = [tok.decode([t]) for t, v in top if math.isfinite(v)]
    assert starts and all("left".startswith(x) or "right".startswith(x) for x in starts), starts
    assert out.text in ("left", "right") and tok.decode(out.token_ids) == out.text


def test_logprobs_beyond_twenty_are_refused():
    with pytest.raises(ValueError, match=r"logprobs must be None or an integer in \[0, 20\]"):
        SamplingParams(logprobs=21)


@pytest.mark.parametrize("chunk", [3, 64])
def test_prompt_logprobs_are_the_models_at_every_position_chunked_or_not(tiny_model_dir, chunk):
    """Each prompt token after the first, scored by the logits of the position before it, as
    one forward over the whole prompt gives them; the same in 3-token chunks; the prefix cache
    is not taken (it holds no logits), so a second run scores the prompt again."""
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    llm = LLM(model=tiny_model_dir, kv_tokens=512, chunk_tokens=chunk, check_invariants=True)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=2)
    first, again = (llm.generate([prompt], params)[0] for _ in range(2))
    admits = llm.core.receipts.of("admission.admit")
    assert admits and all(
        a["no_prefix"] == "prompt_logprobs" and a["prefix_hit"] == 0 for a in admits
    )
    expected = torch.log_softmax(llm.core.sequence_logits(prompt), -1)
    llm.close()
    for out in (first, again):
        assert [t for t, _, _ in out.prompt_logprobs] == prompt[1:]
        for p, (t, lp, top) in enumerate(out.prompt_logprobs):
            assert lp == pytest.approx(float(expected[p, t]), abs=1e-4)
            assert len(top) == 2 and top[0][1] == pytest.approx(float(expected[p].max()), abs=1e-4)
        # each prompt token's place among all tokens (1: the most likely), as vLLM's rank
        ranks = [int((expected[p] > expected[p, t]).sum()) + 1 for p, t in enumerate(prompt[1:])]
        assert out.prompt_ranks == ranks
    assert first.logprobs is None and len(first.token_ids) == 2
