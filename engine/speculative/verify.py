"""Acceptance: which of a request's drafted tokens the target model keeps, and the token it adds.

The target scores the request's last token and its ``k`` drafts in one forward: row ``i`` is its
distribution for the token after draft ``i`` (row 0: after the last real token), each given the
drafts before it. Both rules emit the accepted drafts and then exactly one token of the target's
own: at the first rejected position its correction, or past the last draft a bonus token.

- ``accept_greedy``: a draft stays while it is the target's argmax: the output is the one greedy
  decoding gives, token for token, whatever was proposed.
- ``accept_sampled``: a proposer that has no distribution of its own proposes each draft ``d``
  with certainty, so speculative sampling's rule becomes: keep ``d`` with probability ``p(d)``
  under the target's distribution ``p`` (the one the request samples from: after its grammar
  mask, bias, penalties, temperature and filters); at the first refusal, draw from ``p`` with
  ``d`` taken out and the rest renormalised. Each emitted token is then distributed exactly as
  ``p``: ``P(d) = p(d)`` and, for ``x != d``, ``(1 - p(d)) * p(x) / (1 - p(d)) = p(x)``.

``verify`` makes each row the distribution the request samples from at its position, as the
sampler would (``engine.model.sampling``): the logit bias, then the penalties over the output and the
drafts before that row; greedy takes the argmax, the rest the filtered softmax. The rows come
masked (the grammar, stop tokens not yet allowed) by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.model.sampling import SamplingParams, adjust_logits, filtered_probs


def accept_greedy(drafts: Sequence[int], argmaxes: Sequence[int]) -> list[int]:
    """``argmaxes``: the target's argmax at each of the ``len(drafts) + 1`` rows."""
    if len(argmaxes) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} rows, got {len(argmaxes)}")
    out: list[int] = []
    for d, best in zip(drafts, argmaxes):
        if d != best:
            return [*out, best]
        out.append(d)
    return [*out, argmaxes[len(drafts)]]


def accept_sampled(
    drafts: Sequence[int], probs: torch.Tensor, gen: torch.Generator | None = None
) -> list[int]:
    """``probs``: [len(drafts) + 1, V], row i the distribution the token after draft i is drawn
    from. One uniform draw per draft examined, one multinomial for the token of the target's."""
    if probs.shape[0] != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} rows, got {probs.shape[0]}")
    out: list[int] = []
    for i, d in enumerate(drafts):
        p = probs[i]
        if float(torch.rand((), generator=gen)) < float(p[d]):
            out.append(d)
            continue
        rest = p.clone()
        rest[d] = 0.0
        total = float(rest.sum())
        if total <= 0.0:  # p(d) was 1 and the uniform draw was exactly 1: keep it after all
            return [*out, d]
        return [*out, int(torch.multinomial(rest / total, 1, generator=gen))]
    return [*out, int(torch.multinomial(probs[len(drafts)], 1, generator=gen))]


def verify(
    drafts: Sequence[int],
    rows: torch.Tensor,
    p: SamplingParams,
    gen: torch.Generator | None,
    generated: Sequence[int],
    prompt: Sequence[int],
) -> tuple[list[int], torch.Tensor]:
    """The tokens the rows emit for a request whose output so far is ``generated``, and the
    rows adjusted as the sampler adjusts them, in place (what its logprobs are read from; the
    caller's copy: the step's speculator clones the forward's logits once)."""
    if rows.dtype != torch.float32 or rows.dim() != 2:
        raise TypeError(f"draft rows must be [k + 1, V] float32, got {rows.dtype} {rows.shape}")
    if p.adjusts_logits:
        for i, row in enumerate(rows):
            adjust_logits(row, p, [*generated, *drafts[:i]], prompt)
    if p.greedy:
        return accept_greedy(drafts, rows.argmax(dim=-1).tolist()), rows
    probs = torch.stack([filtered_probs(row, p) for row in rows])
    return accept_sampled(drafts, probs, gen), rows
