"""The Triton attention backend: compiled kernels on CUDA, Triton's interpreter on CPU tensors.

Per forward it derives the kernels' index tensors once (in ``meta.scratch``) and reuses them in
every layer, together with the decode kernel's per-split scratch buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.attention import AttentionBackend, AttentionMetadata, GraphDecode, LayerKV


@dataclass(slots=True)
class TritonPlan:
    decode: bool
    rows: torch.Tensor  # [R] int64 on the device
    prefix_lens: torch.Tensor  # [R] int32
    extend_lens: torch.Tensor  # [R] int32
    q_start: torch.Tensor  # [R] int32
    context_lens: torch.Tensor  # [R] int32: prefix + extend
    max_extend: int
    splits: int  # decode only
    part_o: torch.Tensor | None = None
    part_lse: torch.Tensor | None = None


class TritonBackend(AttentionBackend):
    name = "triton"

    def __init__(self, max_splits: int = 16, min_split_tokens: int = 64) -> None:
        from kernels import triton_kernels

        self.k = triton_kernels
        self.max_splits = max_splits
        self.min_split_tokens = min_split_tokens

    def plan(self, meta: AttentionMetadata, q: torch.Tensor) -> TritonPlan:
        plan = meta.scratch.get("triton")
        if plan is not None:
            return plan
        dev = q.device

        def ints(xs: list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.tensor(xs, dtype=dtype, device=dev)

        starts, acc = [], 0
        for e in meta.extend_lens:
            starts.append(acc)
            acc += e
        decode = meta.is_decode
        splits = 1
        if decode:
            splits = self.k.decode_splits(
                max(meta.prefix_lens) + 1, self.max_splits, self.min_split_tokens
            )
        plan = TritonPlan(
            decode=decode,
            rows=ints(meta.req_rows, torch.int64),
            prefix_lens=ints(meta.prefix_lens),
            extend_lens=ints(meta.extend_lens),
            q_start=ints(starts),
            context_lens=ints([p + e for p, e in zip(meta.prefix_lens, meta.extend_lens)]),
            max_extend=max(meta.extend_lens),
            splits=splits,
        )
        if decode:
            b, heads, d = q.shape
            plan.part_o = torch.empty(b, heads, splits, d, dtype=torch.float32, device=dev)
            plan.part_lse = torch.empty(b, heads, splits, dtype=torch.float32, device=dev)
        meta.scratch["triton"] = plan
        return plan

    def graph_decode(
        self,
        rows: int,
        width: int,
        heads: int,
        kv: LayerKV,
        scale: float,
        q_dtype: torch.dtype,
        context_lens: torch.Tensor,
    ) -> GraphDecode:
        """Request ``i`` at row ``i`` of the slot table, its length read from ``context_lens``;
        the split count fixed for the widest context (a short context leaves some of its
        pieces empty, which the merge weighs zero) and the partial buffers made once."""
        dev, head_dim = context_lens.device, kv.k.shape[2]
        splits = self.k.decode_splits(width, self.max_splits, self.min_split_tokens)
        index = torch.arange(rows, device=dev)
        plan = TritonPlan(
            decode=True,
            rows=index,
            prefix_lens=context_lens - 1,  # a copy, never updated: the decode kernels read none
            extend_lens=torch.ones(rows, dtype=torch.int32, device=dev),
            q_start=index.to(torch.int32),
            context_lens=context_lens,
            max_extend=1,
            splits=splits,
            part_o=torch.empty(rows, heads, splits, head_dim, dtype=torch.float32, device=dev),
            part_lse=torch.empty(rows, heads, splits, dtype=torch.float32, device=dev),
        )
        return GraphDecode("triton", plan)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv: LayerKV,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        self.k.store_kv(k, v, kv.k, kv.v, meta.out_slots)
        p = self.plan(meta, q)
        if p.decode:
            return self.k.decode_attention(
                q,
                kv.k,
                kv.v,
                meta.req_to_token,
                p.rows,
                p.context_lens,
                scale,
                p.splits,
                part_o=p.part_o,
                part_lse=p.part_lse,
            )
        return self.k.extend_attention(
            q,
            kv.k,
            kv.v,
            meta.req_to_token,
            p.rows,
            p.prefix_lens,
            p.extend_lens,
            p.q_start,
            p.max_extend,
            scale,
        )
