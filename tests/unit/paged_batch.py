"""Random ragged batches laid out in a paged KV pool the way the allocator lays them out."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.attention import AttentionMetadata, LayerKV


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, H, D]
    k: torch.Tensor  # [T, KVH, D]: the new tokens' keys
    v: torch.Tensor
    kv: LayerKV  # the pool: cached prefixes written, every other slot garbage
    meta: AttentionMetadata
    page_size: int
    scale: float
    context_slots: torch.Tensor  # every slot some request's context occupies

    def pool_copy(self) -> LayerKV:
        return LayerKV(self.kv.k.clone(), self.kv.v.clone())

    def unused_slots(self) -> torch.Tensor:
        used = torch.zeros(self.kv.k.shape[0], dtype=torch.bool)
        used[self.context_slots] = True
        return torch.nonzero(~used).flatten()


def make_paged_batch(
    spec: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    page_size: int = 1,
    seed: int = 0,
) -> PagedBatch:
    """``spec``: (prefix, extend) per request. Each request owns whole pages taken at random
    from a pool twice as large as needed (page 0 is the padding page); token ``j`` of a request
    sits at offset ``j % page_size`` of its ``j // page_size``-th page. Rows of the slot table
    are shuffled and wider than any context."""
    g = torch.Generator().manual_seed(seed)
    need = [math.ceil((p + e) / page_size) for p, e in spec]
    num_pages = 2 * sum(need) + 2
    page_order = (torch.randperm(num_pages, generator=g) + 1).tolist()
    pool_slots = (num_pages + 1) * page_size
    rows = torch.randperm(len(spec) + 2, generator=g).tolist()
    width = max(p + e for p, e in spec) + page_size + 3

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    kv = LayerKV(
        k=rand(pool_slots, kv_heads, head_dim) * 3, v=rand(pool_slots, kv_heads, head_dim) * 3
    )
    table = torch.zeros(len(rows), width, dtype=torch.int64)
    new_k, new_v, positions, out_slots, context = [], [], [], [], []
    for i, ((prefix, ext), n) in enumerate(zip(spec, need)):
        pages = torch.tensor(page_order[:n], dtype=torch.int64)
        del page_order[:n]
        ctx = prefix + ext
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:ctx]
        table[rows[i], :ctx] = slots
        kv.k[slots[:prefix]] = rand(prefix, kv_heads, head_dim)
        kv.v[slots[:prefix]] = rand(prefix, kv_heads, head_dim)
        new_k.append(rand(ext, kv_heads, head_dim))
        new_v.append(rand(ext, kv_heads, head_dim))
        positions.append(torch.arange(prefix, ctx))
        out_slots.append(slots[prefix:])
        context.append(slots)
    meta = AttentionMetadata(
        req_to_token=table,
        req_rows=rows[: len(spec)],
        prefix_lens=[p for p, _ in spec],
        extend_lens=[e for _, e in spec],
        positions=torch.cat(positions),
        out_slots=torch.cat(out_slots),
    )
    meta.validate()
    return PagedBatch(
        q=rand(meta.num_tokens, heads, head_dim) * 2,
        k=torch.cat(new_k),
        v=torch.cat(new_v),
        kv=kv,
        meta=meta,
        page_size=page_size,
        scale=1 / math.sqrt(head_dim),
        context_slots=torch.cat(context),
    )


def random_spec(g: torch.Generator, max_requests: int, max_len: int, decode: bool):
    """A ragged batch: some empty prefixes, some long ones, extends of 1 and more."""
    n = int(torch.randint(1, max_requests + 1, (1,), generator=g))
    spec = []
    for _ in range(n):
        empty = bool(torch.rand(1, generator=g) < 0.3)
        prefix = 0 if empty else int(torch.randint(1, max_len, (1,), generator=g))
        ext = 1 if decode else int(torch.randint(1, max_len, (1,), generator=g))
        spec.append((prefix, ext))
    return spec
