"""The grouped paged decode at the engine level: the same greedy tokens as the padded decode it
replaced, with pages of 1 and 4 slots, a batch of ragged contexts decoding together."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams


def greedy(model: str, backend: str, page_size: int, prompts) -> list[list[int]]:
    llm = LLM(
        model=model,
        attention_backend=backend,
        kv_tokens=2048,
        page_size=page_size,
        max_running=8,
        check_invariants=True,
    )
    assert llm.core.describe()["attention_backend"] == backend
    try:
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        return [o.token_ids for o in llm.generate(prompts, params)]
    finally:
        llm.close()


@pytest.mark.parametrize("page_size", [1, 4])
def test_grouped_decode_gives_the_padded_decodes_tokens(tiny_model_dir, page_size):
    rng = random.Random(page_size)
    prompts = [[rng.randrange(2, 200) for _ in range(rng.randint(1, 50))] for _ in range(7)]
    want = greedy(tiny_model_dir, "torch-padded", page_size, prompts)
    got = greedy(tiny_model_dir, "torch", page_size, prompts)
    assert got == want
