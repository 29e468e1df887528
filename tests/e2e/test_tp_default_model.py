"""The default model (9 heads, 3 KV heads) at tp=3 gives the greedy tokens of tp=1: each rank
holds three query heads and one KV head; gloo on loopback. Slow: three copies of the model."""

from __future__ import annotations

import pytest

from engine.llm import LLM
from engine.model.sampling import SamplingParams
from tests.conftest import requires_default_model

pytestmark = [pytest.mark.slow, requires_default_model]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Write a haiku about the sea.",
    "List three prime numbers:",
]


def test_tp3_is_token_exact_with_tp1():
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    one = LLM(None, kv_tokens=4096)
    ids = [one.tokenizer.encode(p) for p in PROMPTS]
    want = [o.token_ids for o in one.generate(ids, params)]
    one.close()
    del one
    three = LLM(None, tp=3, kv_tokens=[4096, 3072, 2048])
    try:
        assert three.core.model.local_heads == 3 and three.core.model.local_kv_heads == 1
        got = [o.token_ids for o in three.generate(ids, params)]
    finally:
        three.close()
    assert got == want
