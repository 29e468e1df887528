"""Decode attention over the paged pool with grouped queries: no per-request gather, no GQA copy.

A decode batch is B requests with one query each. The pool is ``[slots, kv_heads, d]``; seen as
``[slots * kv_heads, d]``, row ``slot * kv_heads + h`` is KV head ``h`` of ``slot``. One index,
built once per forward and reused by every layer, names those rows in ``[B, kv_heads, L]``
order, so a single ``index_select`` per layer lays each request's context out as the batched
matrix the product wants, ``[B * kv_heads, L, d]``. The ``group = heads / kv_heads`` query heads
that share a KV head are the rows of one ``[group, d]`` matrix (query head ``h * group + j``
uses KV head ``h``, the mapping ``repeat_interleave`` makes), so

    scores = q[B * kv_heads, group, d] @ K[B * kv_heads, L, d]^T       -> [B * kv_heads, group, L]

reads each K/V row once for the whole group instead of ``group`` copies of it. Positions past a
request's length (the batch is padded to the longest context) are masked with ``-inf`` before
the softmax, the same padded width the reference uses, so its reductions run over the same
lengths.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.attention import AttentionMetadata


class DecodePlan(NamedTuple):
    """What every layer of one decode forward shares: the pool rows to read and the mask."""

    rows: torch.Tensor  # [B * kv_heads * L] int64: pool rows (slot * kv_heads + h) to read
    bias: torch.Tensor  # [B, 1, 1, L] float: 0 inside a request's context, -inf past it
    width: int  # L, the longest context in the batch


class IndexBuffers:
    """Index tensors kept across forwards: a decode step builds its plan into them instead of
    allocating new ones (the widths grow by one token a step, so they are mostly reused)."""

    def __init__(self) -> None:
        self._store: dict[str, torch.Tensor] = {}

    def take(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buf = self._store.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(
                max(numel, 2 * (buf.numel() if buf is not None else 0)), dtype=dtype, device=device
            )
            self._store[name] = buf
        return buf[:numel]


def context_slots(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Each new token's context in the pool: ``slots`` [T, L] (its request's slot row, L the
    longest context, this step's tokens included) and ``lens`` [T] (the token's position + 1).
    A decode batch has one token a request; a short extend (a request's drafted tokens) has one
    row per token, each seeing the context up to itself. Slots past a row's length are stale
    but valid indices; every reader masks them by ``lens``."""
    dev = meta.req_to_token.device
    width = max(p + e for p, e in zip(meta.prefix_lens, meta.extend_lens))
    each = list(zip(meta.req_rows, meta.prefix_lens, meta.extend_lens))
    rows = torch.tensor([r for r, _, e in each for _ in range(e)], dtype=torch.int64, device=dev)
    lens = [p + j + 1 for _, p, e in each for j in range(e)]
    return meta.req_to_token[rows, :width], torch.tensor(lens, dtype=torch.int64, device=dev)


def native_slots(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """``context_slots`` of this forward, built once and kept in ``meta.scratch`` for every
    native call that reads the pool by it (each layer's attention, or the one-call step)."""
    plan = meta.scratch.get("native")
    if plan is None:
        plan = meta.scratch["native"] = context_slots(meta)
    return plan


def build_plan(
    meta: AttentionMetadata, kv_heads: int, dtype: torch.dtype, buffers: IndexBuffers | None = None
) -> DecodePlan:
    """The plan of a decode batch (every ``extend_lens`` 1): built once per forward."""
    dev = meta.req_to_token.device
    buffers = buffers or IndexBuffers()
    slots, lens = context_slots(meta)  # [B, L], [B]
    b, width = slots.shape
    rows = buffers.take("rows", b * kv_heads * width, torch.int64, dev).view(b, kv_heads, width)
    heads = torch.arange(kv_heads, dtype=torch.int64, device=dev)
    torch.add(slots.unsqueeze(1) * kv_heads, heads[None, :, None], out=rows)
    past = torch.arange(width, device=dev)[None, :] >= lens[:, None]  # [B, L]
    bias = torch.zeros(b, width, dtype=dtype, device=dev).masked_fill_(past, float("-inf"))
    return DecodePlan(rows.view(-1), bias.view(b, 1, 1, width), width)


def grouped_decode(
    q: torch.Tensor,  # [B, heads, d]
    pool_k: torch.Tensor,  # [slots, kv_heads, d]
    pool_v: torch.Tensor,
    plan: DecodePlan,
    scale: float,
) -> torch.Tensor:  # [B, heads, d]
    """Attention of one query per request against its context in the pool, by plan."""
    b, heads, d = q.shape
    kv_heads = pool_k.shape[1]
    group = heads // kv_heads
    shape = (b * kv_heads, plan.width, d)
    # computed in the pool's dtype (a float32 pool under bfloat16 activations: fast mode)
    k = pool_k.view(-1, d).index_select(0, plan.rows).view(shape)
    v = pool_v.view(-1, d).index_select(0, plan.rows).view(shape)
    qg = (q.to(k.dtype) * scale).reshape(b * kv_heads, group, d)
    scores = torch.bmm(qg, k.transpose(1, 2)).view(b, kv_heads, group, plan.width)
    scores.add_(plan.bias)
    probs = torch.softmax(scores, dim=-1).view(b * kv_heads, group, plan.width)
    return torch.bmm(probs, v).view(b, heads, d).to(q.dtype)
