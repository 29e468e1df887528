"""Acceptance keeps the answer: greedy is token-identical to decoding one token at a time,
whatever was drafted; sampled, every emitted token is distributed as the target's own
distribution (chi-square at 0.1 %, seeded, so the verdict is fixed for this code)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.speculative.verify import accept_greedy, accept_sampled

V = 5
CHI2_DF4_AT_0_001 = 18.467  # the chi-square distribution's 99.9th percentile, 4 degrees of freedom


def target(prefix: list[int]) -> int:
    """A deterministic stand-in for a greedy model: the next token is a function of the prefix."""
    return hashlib.blake2b(bytes(prefix), digest_size=1).digest()[0] % V


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, V - 1), max_size=10),
    st.lists(st.integers(0, V - 1), max_size=6),
    st.integers(0, 6),
)
def test_greedy_emits_what_one_token_at_a_time_would(prompt, noise, right):
    ahead = list(prompt)
    for _ in range(right):  # the first `right` drafts are what the target would say
        ahead.append(target(ahead))
    drafts = ahead[len(prompt) :] + noise
    rows = [target(list(prompt) + drafts[:i]) for i in range(len(drafts) + 1)]
    emitted = accept_greedy(drafts, rows)
    one_by_one = list(prompt)
    for _ in emitted:
        one_by_one.append(target(one_by_one))
    assert emitted == one_by_one[len(prompt) :]
    assert len(emitted) >= min(right, len(drafts)) + 1


def chi2(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = counts.sum() * p
    return float(((counts - expected) ** 2 / expected).sum())


P0 = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
P1 = torch.tensor([0.1, 0.1, 0.5, 0.2, 0.1])
P2 = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1])


@pytest.fixture(scope="module")
def draws():
    """20,000 emissions for drafts [1, 2] under rows P0, P1, P2."""
    gen = torch.Generator().manual_seed(1234)
    probs = torch.stack([P0, P1, P2])
    return [accept_sampled([1, 2], probs, gen) for _ in range(20_000)]


def test_the_first_token_is_distributed_as_the_target(draws):
    counts = torch.bincount(torch.tensor([d[0] for d in draws]), minlength=V).double()
    assert chi2(counts, P0.double()) < CHI2_DF4_AT_0_001


def test_after_an_accepted_draft_the_next_token_is_distributed_as_its_row(draws):
    seconds = [d[1] for d in draws if d[0] == 1]  # draft 1 kept: the next comes from P1
    counts = torch.bincount(torch.tensor(seconds), minlength=V).double()
    assert len(seconds) > 4000 and chi2(counts, P1.double()) < CHI2_DF4_AT_0_001
    bonus = [d[2] for d in draws if d[:2] == [1, 2]]  # both kept: the bonus comes from P2
    counts = torch.bincount(torch.tensor(bonus), minlength=V).double()
    assert len(bonus) > 1500 and chi2(counts, P2.double()) < CHI2_DF4_AT_0_001


def test_rows_must_be_one_more_than_the_drafts():
    with pytest.raises(ValueError, match="2 drafts need 3 rows"):
        accept_greedy([1, 2], [1, 2])
    with pytest.raises(ValueError, match="1 drafts need 2 rows"):
        accept_sampled([1], P0[None])
