"""The sampler: logit bias and penalties, then greedy, temperature, top-k, top-p, min-p, with
per-request seeds."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Protocol

import torch

from engine.request.sampling_params import SamplingParams
from kernels import cpu_ops

__all__ = [
    "SamplingParams",
    "adjust_logits",
    "filtered_probs",
    "make_generator",
    "sample",
    "prompt_logprobs",
    "rows_of",
    "token_logprobs",
]


class Sampled(Protocol):
    """What the sampler reads of a request."""

    params: SamplingParams
    generator: torch.Generator | None
    output_ids: list[int]
    prompt_ids: list[int]


def make_generator(seed: int | None) -> torch.Generator | None:
    """A per-request generator: a seeded request draws the same numbers in any batch, and
    distinct seeds of the signed 64-bit range draw distinct numbers.

    The seed is taken as its unsigned 64-bit two's complement. torch's CPU generator (mt19937)
    seeds itself from the low 32 bits only, so a seed below 2**32 is its own mt19937 seed (the
    numbers it always drew), and a wider one sets the whole state (``_wide_state``)."""
    if seed is None:
        return None
    g = torch.Generator()
    u = seed % 2**64
    g.manual_seed(u)
    if u >> 32:
        g.set_state(_wide_state(g.get_state(), u))
    return g


_MT_N, _MASK32 = 624, 2**32 - 1
_STATE_AT = 24  # torch's CPU generator state: seed u64, left i32, seeded i32, next u64, words


def _mt_next(word: int, i: int) -> int:
    """mt19937's seeding recurrence: word i from word i - 1."""
    return (1812433253 * (word ^ (word >> 30)) + i) & _MASK32


def _wide_state(state: torch.Tensor, u: int) -> torch.Tensor:
    """``state`` (torch's, seeded with ``u``, so from its low half only) with mt19937's words
    made from all 64 bits: words 0 and 1 as the low half seeds them, word 2 what the low half
    makes there xor the high half (not 0: ``u`` is wider than 32 bits), the rest by the seeding
    recurrence. mt19937 draws from words 1..623 (and word 0's top bit); words 1 and 2 give back
    the two halves, so distinct seeds make distinct states, and none is a 32-bit seed's."""
    raw = bytearray(state.numpy().tobytes())
    low, high = u & _MASK32, u >> 32
    words = [low, _mt_next(low, 1)]
    seeded = struct.unpack_from("<Q", raw, 0)[0], list(struct.unpack_from("<2Q", raw, _STATE_AT))
    if seeded != (u, words):
        raise RuntimeError("torch's CPU generator state is not laid out as make_generator reads it")
    words.append(_mt_next(words[1], 2) ^ high)
    for i in range(3, _MT_N):
        words.append(_mt_next(words[-1], i))
    struct.pack_into(f"<{_MT_N}Q", raw, _STATE_AT, *words)
    return torch.frombuffer(raw, dtype=torch.uint8).clone()


def rows_of(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The rows of ``logits`` a step samples from, in order and contiguous (the grammars' masks
    are written in place, and xgrammar's CPU kernel would mask a copy of strided rows):
    ``logits`` itself when they are all of its rows in order (a decode step's, most often) and it
    is contiguous, else a copy. A copy of 64 rows of a 49,152-token vocabulary, taken from the
    LM head's transposed product by a list of ints, was about a sixth of a 64-stream bfloat16
    decode step (BENCHMARKS.md)."""
    if rows == list(range(logits.shape[0])):
        return logits.contiguous()
    return logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=logits.device))


def greedy_rows(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (the first of equal maxima; a row's first NaN where it holds one): the
    native op on the CPU (``attest::argmax_rows``, one pass of vector compares: 271.7 us over a
    [64, 49152] against 864.8 for torch's ``max`` on an Intel Xeon, ``bench/native_ops.py``,
    BENCHMARKS.md), else ``max``'s indices, argmax's own and three times faster than ``argmax``
    over those rows."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and cpu_ops.load():
        if logits.dim() == 2 and logits.shape[1] > 0 and logits.stride(1) == 1:
            return torch.ops.attest.argmax_rows(logits).tolist()
    return logits.max(dim=-1).indices.tolist()


def sample_for(logits: torch.Tensor, reqs: Sequence[Sampled]) -> list[int]:
    """One token for each request, from its row of ``logits``."""
    return sample(
        logits,
        [r.params for r in reqs],
        [r.generator for r in reqs],
        [r.output_ids for r in reqs],
        [r.prompt_ids for r in reqs],
    )


def sample(
    logits: torch.Tensor,  # [B, V] fp32
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    outputs: Sequence[list[int]] | None = None,
    prompts: Sequence[list[int]] | None = None,
) -> list[int]:
    """One token per row. Rows whose request sets a bias or a penalty are adjusted first (on a
    copy: ``logits`` is left as it was), over ``outputs``, the tokens each has generated (and
    ``prompts``, for the repetition penalty). Greedy rows take the argmax; the rest sample from
    the filtered softmax."""
    rows = [i for i, p in enumerate(params) if p.adjusts_logits]
    if rows:
        logits = logits.clone()
        for i in rows:
            adjust_logits(
                logits[i],
                params[i],
                outputs[i] if outputs is not None else [],
                prompts[i] if prompts is not None else (),
            )
    out = greedy_rows(logits)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        out[i] = _sample_row(logits[i], p, generators[i])
    return out


def adjust_logits(
    row: torch.Tensor, p: SamplingParams, generated: list[int], prompt: Sequence[int] = ()
) -> None:
    """Apply ``p``'s logit bias, then its repetition penalty (over ``prompt`` and ``generated``),
    then its presence and frequency penalties (over ``generated``) to ``row``, in place, in
    vLLM's order. An id outside the row is skipped: the HTTP layer refuses those, and the
    sampler must not fail the whole batch for one request."""
    vocab = row.numel()
    if p.logit_bias:
        bias = [(t, b) for t, b in p.logit_bias.items() if t < vocab]
        if bias:
            ids, values = zip(*bias)
            row[list(ids)] += torch.tensor(values, dtype=row.dtype)
    if p.repetition_penalty != 1.0 and (generated or prompt):
        seen = torch.tensor([*prompt, *generated]).unique()
        seen = seen[seen < vocab]
        x = row[seen]
        row[seen] = torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and generated:
        ids, counts = torch.tensor(generated).unique(return_counts=True)
        keep = ids < vocab
        ids, counts = ids[keep], counts[keep].to(row.dtype)
        row[ids] -= p.frequency_penalty * counts + p.presence_penalty


def token_logprobs(
    row: torch.Tensor, token: int, p: SamplingParams, generated: list[int], prompt: Sequence[int]
) -> tuple[int, float, tuple[tuple[int, float], ...]]:
    """``token``'s log-probability, and the ``p.logprobs`` most likely tokens' (most likely
    first), in the distribution the model gave after the grammar mask (already in ``row``), the
    logit bias and the penalties, before temperature and the top-k / top-p / min-p filters (so a
    greedy request's are the model's, not a one-hot). ``generated``: the output before
    ``token``."""
    if p.adjusts_logits:
        row = row.clone()
        adjust_logits(row, p, generated, prompt)
    return prompt_logprobs(row[None], [token], p.logprobs or 0)[0]


def prompt_logprobs(
    logits: torch.Tensor, targets: Sequence[int], k: int
) -> list[tuple[int, float, tuple[tuple[int, float], ...]]]:
    """Each target's log-probability under its row (row i predicts ``targets[i]``), with the
    ``k`` most likely tokens', most likely first: the distribution the rows hold, nothing
    adjusted here (a prompt's are the model's own; ``token_logprobs`` adjusts first)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    picked = lp[torch.arange(len(targets)), torch.tensor(targets, dtype=torch.int64)].tolist()
    tops: list[tuple[tuple[int, float], ...]] = [()] * len(targets)
    if k:
        values, ids = torch.topk(lp, min(k, lp.shape[-1]), dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    return list(zip(targets, picked, tops))


def target_ranks(logits: torch.Tensor, targets: Sequence[int]) -> list[int]:
    """Each target's place among all tokens under its row (1: the most likely; tokens that tie
    with it do not count ahead of it), as vLLM ranks a prompt's tokens."""
    rows = logits.float()
    picked = rows[torch.arange(len(targets)), torch.tensor(targets, dtype=torch.int64)]
    return ((rows > picked[:, None]).sum(-1) + 1).tolist()


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
