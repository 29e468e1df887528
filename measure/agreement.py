"""Greedy agreement of two engines on the same prompts: how often fast mode picks exact mode's
next token.

Teacher-forced: exact mode generates ``n`` greedy tokens per prompt; then, for every position,
the other engine is given the prompt plus exact mode's tokens before that position and asked
for one greedy token. The share of positions where the two agree is the measure (a free-running
comparison would count every token after a first difference as a miss, however close the two
models are). The length of the common prefix of the two free-running outputs is reported too.
"""

from __future__ import annotations

from dataclasses import dataclass

# Held-out prompts: chat questions nothing in fast mode was chosen on.
PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three uses of copper.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
    "Give me a short recipe for pancakes.",
    "What causes the seasons on Earth?",
)


@dataclass(slots=True)
class Agreement:
    positions: int  # positions compared (prompts x tokens)
    equal: int  # positions where the two engines chose the same next token
    common_prefix: list[int]  # per prompt: tokens the free-running outputs share from the start

    @property
    def share(self) -> float:
        return self.equal / self.positions if self.positions else 0.0


def greedy_agreement(reference, other, prompts: list[list[int]], n: int) -> Agreement:
    """``reference`` and ``other``: ``engine.LLM`` instances; ``prompts``: token ids."""
    from engine import SamplingParams

    greedy = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    ref = [o.token_ids for o in reference.generate(prompts, greedy)]
    free = [o.token_ids for o in other.generate(prompts, greedy)]
    forced = [p + r[:i] for p, r in zip(prompts, ref) for i in range(n)]
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    picks = [o.token_ids[0] for o in other.generate(forced, one)]
    wanted = [t for r in ref for t in r[:n]]
    prefix = []
    for a, b in zip(ref, free):
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(k)
    return Agreement(len(wanted), sum(a == b for a, b in zip(picks, wanted)), prefix)
