"""The proposers against brute force: prompt lookup proposes what followed the most recent
earlier occurrence of the longest suffix seen before; the recent-outputs store the same across
outputs (longest first, then the newest output), within its bound in tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.speculative.propose import NgramIndex, PromptLookup, RecentOutputs, SuffixLookup

SEQ = st.lists(st.integers(0, 3), max_size=40)


def brute_lookup(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    end = len(tokens)
    for n in range(min(n_max, end), n_min - 1, -1):
        suffix = tokens[end - n :]
        for e in range(end - 1, n - 1, -1):  # earlier ends, most recent first
            if tokens[e - n : e] == suffix:
                return tokens[e : e + k]
    return []


def test_the_longest_suffix_wins_then_its_most_recent_occurrence():
    assert NgramIndex(2, 4, [1, 2, 3, 4, 9, 1, 2, 3]).propose(3) == [4, 9, 1]
    assert NgramIndex(2, 4, [1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3]).propose(2) == [7, 9]  # not [8, 1]
    assert NgramIndex(2, 4, [1, 2, 5, 1, 2, 6, 1, 2]).propose(2) == [6, 1]
    assert NgramIndex(2, 4, [1, 2, 3, 4]).propose(3) == []  # nothing seen twice
    with pytest.raises(ValueError, match="n_min <= n_max"):
        NgramIndex(3, 2)


@settings(max_examples=300, deadline=None)
@given(SEQ, st.integers(1, 5), st.integers(1, 3), st.integers(0, 2))
def test_prompt_lookup_is_brute_force_at_every_length(tokens, k, n_min, wider):
    index = NgramIndex(n_min, n_min + wider)
    for i, t in enumerate(tokens):
        index.extend([t])
        assert index.propose(k) == brute_lookup(tokens[: i + 1], k, n_min, n_min + wider)


def brute_recent(held: list[list[int]], text: list[int], k: int, n_min: int, n_max: int):
    for n in range(min(n_max, len(text)), n_min - 1, -1):
        suffix = text[len(text) - n :]
        for out in reversed(held):  # the newest output first, its last occurrence first
            for e in range(len(out) - 1, n - 1, -1):
                if out[e - n : e] == suffix:
                    return out[e : e + k]
    return []


@settings(max_examples=200, deadline=None)
@given(st.lists(SEQ, max_size=8), SEQ, st.integers(1, 4), st.integers(8, 60))
def test_recent_outputs_is_brute_force_over_what_it_still_holds(outputs, text, k, bound):
    store = RecentOutputs(max_tokens=bound, n_min=2, n_max=3)
    held: list[list[int]] = []
    for out in outputs:
        store.add(out)
        if len(out) > store.n_min:
            held.append(out[-bound:])
        while sum(map(len, held)) > bound:
            held.pop(0)
        assert store.tokens == sum(map(len, held)) <= bound
    assert store.propose(text, k) == brute_recent(held, text, k, 2, 3)


class Text:
    """What a proposer reads of a request."""

    def __init__(self, prompt: list[int], output: list[int]) -> None:
        self.prompt_ids, self.output_ids, self.spec = prompt, output, None


def test_suffix_lookup_takes_the_longer_match_its_own_on_a_tie():
    proposer = SuffixLookup()
    proposer.finished(Text([], [5, 6, 7, 8, 1, 2, 3, 4]))  # another request's output
    # its own text repeats only (2, 3): the other output matches (1, 2, 3), longer
    assert proposer.propose(Text([9, 2, 3, 0, 1], [2, 3]), 2) == [4]
    # its own text repeats (1, 2, 3) too: a tie, its own wins
    assert proposer.propose(Text([1, 2, 3, 9, 9, 1], [2, 3]), 2) == [9, 9]
    # nothing anywhere
    assert proposer.propose(Text([11, 12], [13]), 2) == []


def test_prompt_lookup_indexes_only_what_is_new():
    req = Text([1, 2, 3, 4, 1, 2, 3], [])
    assert PromptLookup().propose(req, 2) == [4, 1]
    req.output_ids += [9, 1, 2, 3]
    assert PromptLookup().propose(req, 2) == [9, 1]  # the most recent (1, 2, 3) before now
    assert len(req.spec.tokens) == 11
