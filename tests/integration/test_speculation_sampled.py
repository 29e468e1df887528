"""Sampled speculation keeps the distribution: the tiny model's second and third tokens, drawn
many times at temperature 1 with top-k 3, with drafts (a proposer that always offers the
reference run's most frequent second token) and without, agree by a two-sample chi-square test
at 0.1 % (the scheduler's seed fixes every draw, so the verdict is fixed for this code). The
rule that keeps a draft with probability p(d) and otherwise draws from p without it is what
makes them agree: keeping every draft, or drawing the correction from the whole of p, fails."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from engine import LLM, SamplingParams

PROMPT = [17, 90, 4, 211, 35, 17, 90, 4, 211, 35, 17, 90]
N = 600
PARAMS = SamplingParams(max_tokens=3, temperature=1.0, top_k=3, ignore_eos=True)


class Always:
    """Proposes the same token ``k`` times, whatever the text."""

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, req, k: int) -> list[int]:
        return [self.token] * k

    def finished(self, req) -> None:
        pass


def two_sample_p(a: Counter, b: Counter) -> float:
    """The p-value of a chi-square test that ``a`` and ``b`` count draws from one distribution
    (categories seen fewer than 10 times in both together are pooled)."""
    keys = sorted(set(a) | set(b))
    rare = [k for k in keys if a[k] + b[k] < 10]
    rows = [[a[k], b[k]] for k in keys if k not in rare]
    if rare:
        rows.append([sum(a[k] for k in rare), sum(b[k] for k in rare)])
    table = torch.tensor(rows, dtype=torch.float64)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    df = torch.tensor((len(rows) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, stat / 2))


def draws(llm: LLM) -> tuple[Counter, Counter]:
    outs = llm.generate([PROMPT] * N, PARAMS)
    return Counter(o.token_ids[1] for o in outs), Counter(o.token_ids[2] for o in outs)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, kv_tokens=65536, max_running=8, seed=3)
    second, third = draws(llm)
    llm.close()
    return second, third


def test_drafted_sampling_draws_from_the_same_distribution(tiny_model_dir, reference):
    second, third = reference
    draft = second.most_common(1)[0][0]
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=65536,
        max_running=8,
        seed=4,
        speculative="ngram",
        spec_tokens=2,
    )
    llm.core.scheduler.spec.proposer = Always(draft)
    got_second, got_third = draws(llm)
    fin = llm.core.receipts.of("request.finish")
    proposed = sum(r.get("spec_proposed", 0) for r in fin)
    accepted = sum(r.get("spec_accepted", 0) for r in fin)
    llm.close()
    assert proposed >= N and 0 < accepted < proposed  # drafted, some kept, some refused
    assert two_sample_p(second, got_second) > 1e-3, (second, got_second)
    assert two_sample_p(third, got_third) > 1e-3, (third, got_third)


def test_the_test_tells_different_distributions_apart():
    a = Counter({1: 500, 2: 300, 3: 200})
    assert two_sample_p(a, Counter({1: 500, 2: 300, 3: 200})) > 0.99
    assert two_sample_p(a, Counter({1: 600, 2: 250, 3: 150})) < 1e-3
