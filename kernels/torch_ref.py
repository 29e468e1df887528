"""The torch reference attention backend: CPU, always present, the oracle for the others."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention import AttentionBackend, AttentionMetadata, LayerKV, store_kv


class TorchReferenceBackend(AttentionBackend):
    name = "torch"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv: LayerKV,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        store_kv(k, v, kv, meta.out_slots)
        if len(meta.req_rows) > 1 and meta.is_decode:
            return self._decode_padded(q, kv, meta, scale)
        out = torch.empty_like(q)
        gqa = q.shape[1] != kv.k.shape[1]
        for start, ext, slots, mask, causal in self._extend_plan(meta):
            # [1, heads, len, head_dim] views for SDPA.
            qi = q[start : start + ext].transpose(0, 1).unsqueeze(0)
            ki = kv.k.index_select(0, slots).transpose(0, 1).unsqueeze(0).to(q.dtype)
            vi = kv.v.index_select(0, slots).transpose(0, 1).unsqueeze(0).to(q.dtype)
            oi = F.scaled_dot_product_attention(
                qi, ki, vi, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
            )
            out[start : start + ext] = oi.squeeze(0).transpose(0, 1)
        return out

    @staticmethod
    def _extend_plan(meta: AttentionMetadata) -> list[tuple]:
        """Per request: (first token, new tokens, context slots, mask, causal). The same for
        every layer of this forward, so built once."""
        plan = meta.scratch.get("extend")
        if plan is not None:
            return plan
        plan, start = [], 0
        dev = meta.req_to_token.device
        for row, prefix, ext in zip(meta.req_rows, meta.prefix_lens, meta.extend_lens):
            ctx = prefix + ext
            if ext == 1:
                mask, causal = None, False  # one query sees the whole context
            elif prefix == 0:
                mask, causal = None, True
            else:
                # query j (absolute position prefix + j) sees keys 0 ..= prefix + j
                mask = torch.ones(ext, ctx, dtype=torch.bool, device=dev).tril(prefix)
                causal = False
            plan.append((start, ext, meta.req_to_token[row, :ctx], mask, causal))
            start += ext
        meta.scratch["extend"] = plan
        return plan

    def _decode_padded(
        self, q: torch.Tensor, kv: LayerKV, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        """All decode requests in one padded call: [B, heads, 1, d] against [B, kv_heads, L, d],
        positions past each request's context masked out. One kernel call instead of B."""
        if "decode" not in meta.scratch:  # the same for every layer of this forward
            dev = meta.req_to_token.device
            lens = torch.tensor([p + 1 for p in meta.prefix_lens], dtype=torch.int64, device=dev)
            width = max(meta.prefix_lens) + 1
            rows = torch.tensor(meta.req_rows, dtype=torch.int64, device=dev)
            # slots past a request's length are stale but valid indices; the mask drops them
            idx = meta.req_to_token[rows, :width].flatten()
            mask = (torch.arange(width, device=dev)[None, :] < lens[:, None])[:, None, None, :]
            meta.scratch["decode"] = (idx, mask, width)
        idx, mask, width = meta.scratch["decode"]
        heads, d = kv.k.shape[1], kv.k.shape[2]
        shape = (len(meta.req_rows), width, heads, d)
        # index_select on a flat index is several times faster than 2-D advanced indexing here
        k = kv.k.index_select(0, idx).view(shape).to(q.dtype).transpose(1, 2)  # [B, kvh, L, d]
        v = kv.v.index_select(0, idx).view(shape).to(q.dtype).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), k, v, attn_mask=mask, scale=scale,
            enable_gqa=q.shape[1] != kv.k.shape[1],
        )  # fmt: skip
        return out.squeeze(2)
