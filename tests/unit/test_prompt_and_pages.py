"""The one prompt check (HTTP and scheduler say the same words) and the one page rounding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.memory.pages import fresh_pages, pages_for
from engine.request.prompt import PromptError, check_prompt


@pytest.mark.parametrize(
    "ids, message",
    [
        ([], "prompt is empty: at least one token is needed"),
        ([1, 100, 2], "prompt token id 100 is outside the vocabulary (0..99)"),
        ([1, -1], "prompt token id -1 is outside the vocabulary (0..99)"),
        ([1] * 8, "prompt has 8 tokens; the context limit is 8"),
    ],
)
def test_each_prompt_fault_has_one_message(ids, message):
    with pytest.raises(PromptError) as e:
        check_prompt(ids, vocab_size=100, max_context=8)
    assert str(e.value) == message and e.value.param == "prompt"
    assert isinstance(e.value, ValueError)  # offline callers catch ValueError


def test_a_prompt_that_leaves_room_for_one_token_passes():
    check_prompt([0, 99] + [5] * 5, vocab_size=100, max_context=8)


@given(st.integers(-5, 10_000), st.integers(1, 64))
def test_pages_for_is_the_smallest_cover(tokens, page):
    n = pages_for(tokens, page)
    assert n >= 0 and n * page >= tokens and (n == 0 or (n - 1) * page < tokens)


@given(st.integers(0, 5_000), st.integers(0, 5_000), st.integers(1, 64))
def test_fresh_pages_fill_the_partial_last_page_first(held, extend, page):
    # the pages held after the extension, less the pages held before
    assert fresh_pages(held, extend, page) == pages_for(held + extend, page) - pages_for(held, page)
