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
        out = torch.empty_like(q)
        gqa = q.shape[1] != kv.k.shape[1]
        start = 0
        for row, prefix, ext in zip(meta.req_rows, meta.prefix_lens, meta.extend_lens):
            ctx = prefix + ext
            slots = meta.req_to_token[row, :ctx]
            # [1, heads, len, head_dim] views for SDPA.
            qi = q[start : start + ext].transpose(0, 1).unsqueeze(0)
            ki = kv.k.index_select(0, slots).transpose(0, 1).unsqueeze(0).to(q.dtype)
            vi = kv.v.index_select(0, slots).transpose(0, 1).unsqueeze(0).to(q.dtype)
            if ext == 1:
                mask, causal = None, False  # one query sees the whole context
            elif prefix == 0:
                mask, causal = None, True
            else:
                # query j (absolute position prefix + j) sees keys 0 ..= prefix + j
                mask = torch.ones(ext, ctx, dtype=torch.bool, device=q.device).tril(prefix)
                causal = False
            oi = F.scaled_dot_product_attention(
                qi, ki, vi, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
            )
            out[start : start + ext] = oi.squeeze(0).transpose(0, 1)
            start += ext
        return out
