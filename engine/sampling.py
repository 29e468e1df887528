"""The sampler: greedy, temperature, top-k, top-p, min-p, per-request seeds."""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams

__all__ = ["SamplingParams", "filtered_probs", "make_generator", "sample"]


def make_generator(seed: int | None) -> torch.Generator | None:
    """A per-request generator: a seeded request draws the same numbers in any batch."""
    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def sample(
    logits: torch.Tensor,  # [B, V] fp32
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """One token per row. Greedy rows take the argmax; the rest sample from the filtered softmax."""
    out = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if p.greedy:
            continue
        out[i] = _sample_row(logits[i], p, generators[i])
    return out


def filtered_probs(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy request draws from, after temperature, top-k, top-p, min-p."""
    # Shift so the largest logit is 0 before dividing: a tiny temperature then sends the others
    # towards -inf instead of overflowing every logit to +-inf (NaN after the softmax), and a
    # temperature below the dtype's smallest normal number cannot round to a division by zero.
    x = (row - row.max()) / max(p.temperature, torch.finfo(row.dtype).tiny)
    if p.top_k > 0 and p.top_k < x.numel():
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
        before = sorted_p.cumsum(0) - sorted_p
        drop = before >= p.top_p
        drop[0] = False  # the top token always stays (a top_p below fp32's range rounds to 0)
        probs = probs.scatter(0, order[drop], 0.0)
    if p.min_p > 0.0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    return probs / probs.sum()


def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    probs = filtered_probs(row, p)
    return int(torch.multinomial(probs, 1, generator=gen).item())
