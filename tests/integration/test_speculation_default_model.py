"""Speculation keeps the default model's greedy answers: 20 held-out prompts (half with text to
copy: code, quotes, lists, tool calls; half with none) x 128 tokens, with prompt lookup and
without, in a roomy pool and in a tight one where parks, retractions and cut drafts happen.
Slow: four runs of the default model (about 10 minutes on 2 cores)."""

from __future__ import annotations

from collections import Counter

import pytest

from engine import LLM, SamplingParams
from tests.conftest import requires_default_model

pytestmark = [pytest.mark.slow, requires_default_model]

COPYING = [
    "Repeat this sentence exactly three times: The quick brown fox jumps over the lazy dog.",
    "Rewrite this function with the variable n renamed to count:\n"
    "def f(n):\n    s = 0\n    for i in range(n):\n        s += i * i\n    return s",
    "Quote the first line of this poem, then explain it: 'The sea is calm tonight. The tide "
    "is full, the moon lies fair upon the straits.'",
    'Continue the list in the same format: {"id": 1, "name": "apple"}, {"id": 2, "name": '
    '"banana"}, {"id": 3, "name": "cherry"},',
    "Translate these words to French and list them as 'word: translation': cat, dog, house, "
    "tree, car, book, water, sun.",
    "Write the numbers from 1 to 30 separated by commas.",
    "Here is a CSV header: name,age,city,country. Write five example rows in the same format.",
    "Fix the typo and repeat the paragraph: The comittee will meet on Tuesday to discuss the "
    "budget, the schedule and the new comittee members.",
    "Write a JSON object with the keys name, email and phone for three people, as a list.",
    "Copy this shell command and explain each flag: tar -czvf backup.tar.gz /home/user/docs",
]
NOTHING_TO_COPY = [
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "What are three good habits for learning a new language?",
    "Explain what a prime number is to a child.",
    "Describe the taste of a lemon.",
    "What happened in 1969 that many people remember?",
    "Give me a name for a friendly robot and say why.",
    "How do plants make food from sunlight?",
    "Tell me a short joke about computers.",
    "What should I pack for a weekend in the mountains?",
]


def run(prompts: list[list[int]], **kw) -> tuple[list[list[int]], Counter]:
    llm = LLM(**kw)
    outs = llm.generate(prompts, SamplingParams(max_tokens=128, temperature=0))
    kinds = Counter(r["event"] for r in llm.core.receipts.records)
    kept = sum(r.get("spec_accepted", 0) for r in llm.core.receipts.of("request.finish"))
    kinds["kept"] = kept
    llm.close()
    return [o.token_ids for o in outs], kinds


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    llm = LLM(kv_tokens=1024, receipts=False)
    chats = [
        llm.tokenizer.encode_chat([{"role": "user", "content": p}], True)
        for p in COPYING + NOTHING_TO_COPY
    ]
    llm.close()
    return chats


def test_roomy_pool_same_tokens(prompts):
    plain, _ = run(prompts, kv_tokens=16384, max_running=20)
    drafted, kinds = run(prompts, kv_tokens=16384, max_running=20, speculative="ngram")
    assert drafted == plain
    assert kinds["kept"] > 0


def test_tight_pool_same_tokens_with_parks_retractions_and_cuts(prompts):
    tight = dict(kv_tokens=640, chunk_tokens=32, max_running=8, check_invariants=True)
    plain, _ = run(prompts, **tight)
    drafted, kinds = run(prompts, speculative="ngram", **tight)
    assert drafted == plain
    assert kinds["retract"] > 0 and kinds["spec.cut"] > 0 and kinds["alloc.oom"] == 0, kinds
    assert kinds["kept"] > 0
