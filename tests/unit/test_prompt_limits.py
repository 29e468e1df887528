"""The decisions made before a prompt is tokenized or a request is submitted: a character bound
that needs no tokenizer, and whether prompt + max_tokens can ever fit the context and the pool."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.request.prompt import (
    PromptError,
    check_chars,
    check_prompt,
    fit_max_tokens,
    longest_token_chars,
)


def test_the_character_bound_refuses_only_what_cannot_fit():
    check_chars(8 * 5, max_context=8, token_chars=5)  # 8 tokens of 5 characters could
    with pytest.raises(PromptError) as e:
        check_chars(8 * 5 + 1, max_context=8, token_chars=5)
    assert e.value.param == "prompt"
    assert str(e.value) == (
        "prompt is 41 characters, more than the context limit of 8 tokens can hold "
        "(no token of this model is longer than 5 characters)"
    )


@given(st.lists(st.sampled_from(["a", "bb", "ccc", "dddd"]), max_size=40), st.integers(1, 30))
def test_the_character_bound_never_refuses_a_prompt_that_fits(pieces, context):
    """Whatever the tokens, a text of n tokens has at most n x longest characters."""
    longest = longest_token_chars(["a", "bb", "ccc", "dddd"])
    assert longest == 4
    if len(pieces) <= context:  # fits: never refused by the bound
        check_chars(len("".join(pieces)), max_context=context, token_chars=longest)


def test_a_long_prompt_is_judged_by_its_length_before_its_ids_are_scanned():
    with pytest.raises(PromptError, match="prompt has 9 tokens; the context limit is 8"):
        check_prompt([10**9] * 9, vocab_size=100, max_context=8)


@pytest.mark.parametrize(
    ("prompt", "asked", "context", "pool", "got"),
    [
        (10, None, 100, 1000, 90),  # unset: what the context leaves
        (10, None, 1000, 50, 40),  # unset: what the pool leaves
        (10, 90, 100, 1000, 90),  # exactly fills the context
        (10, 40, 1000, 50, 40),  # exactly fills the pool
        (10, None, 100, 1000, 90),
    ],
)
def test_max_tokens_defaults_to_the_room_left_and_an_exact_fit_passes(
    prompt, asked, context, pool, got
):
    assert fit_max_tokens(prompt, asked, max_context=context, kv_tokens=pool) == got


def test_a_default_is_capped_by_the_room_left():
    assert fit_max_tokens(10, None, max_context=100, kv_tokens=1000, default=16) == 16
    assert fit_max_tokens(95, None, max_context=100, kv_tokens=1000, default=16) == 5


@pytest.mark.parametrize(
    ("prompt", "asked", "context", "pool", "message"),
    [
        (
            1000,
            100,
            8192,
            1024,
            "max_tokens 100 + prompt 1000 tokens exceed the KV pool of 1024 tokens: this request "
            "could never run to its end here; ask for at most 24",
        ),
        (
            10,
            100,
            100,
            1000,
            "max_tokens 100 + prompt 10 tokens exceed the context limit of 100 tokens; ask for at "
            "most 90",
        ),
        (10, 0, 100, 1000, "max_tokens must be at least 1, got 0"),
    ],
)
def test_a_request_that_can_never_fit_is_refused_naming_max_tokens_and_the_limit(
    prompt, asked, context, pool, message
):
    with pytest.raises(PromptError) as e:
        fit_max_tokens(prompt, asked, max_context=context, kv_tokens=pool)
    assert str(e.value) == message and e.value.param == "max_tokens"
