"""The torch reference attention backend: CPU, always present, the oracle for the others.

A batch of decodes runs one of three ways (``decode``): ``native`` (the default where the native
CPU ops are built, ``kernels.cpu_ops``) stores the step's K/V and attends in one call per layer,
reading each request's context rows from the pool in place; ``grouped`` (the default elsewhere,
and on a GPU) reads the pool through one index per forward and multiplies each KV head against
its group of query heads (``kernels.paged_decode``); ``padded`` gathers each request's context
into a padded batch and hands it to SDPA, which expands K/V for GQA (the earlier path, kept as
``torch-padded`` to measure against). All give the same tokens; the equivalence is pinned by
``tests/unit/test_paged_decode.py``. On the native path a forward of short extends (each request
verifying a few drafted tokens) is attended the same way, a row per token, and a longer extend (a
prefill chunk) at head sizes 64 and 128 by the native extend kernel (``kernels/cpu_extend.cpp``),
which reads each context from the pool where it lies; elsewhere an extend gathers its context
for SDPA (``tests/unit/test_native_extend.py`` pins the two together).
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import torch
import torch.nn.functional as F

from kernels import cpu_ops
from kernels.attention import (
    AttentionBackend,
    AttentionMetadata,
    HeadShape,
    LayerKV,
    store_kv,
)
from kernels.paged_decode import (
    IndexBuffers,
    build_plan,
    context_slots,
    grouped_decode,
    native_slots,
)
from kernels.timing import fastest_each

DECODE_PATHS = ("native", "grouped", "padded")
# (activations, pool) dtypes the native kernels take
NATIVE_DTYPES = (
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.bfloat16, torch.bfloat16),
)
# A forward whose requests bring at most this many tokens each is attended row by row by the
# native kernel: decode steps, and verification of up to 16 drafted tokens. A longer extend
# (a prefill chunk) is attended sixteen queries at a time (the extend kernel, or SDPA), which is
# faster over many queries.
SHORT_EXTEND = 17
# The prefill chunk, in tokens, over which the native extend kernel and SDPA are timed at boot
# (``TorchReferenceBackend.prepare``).
EXTEND_TIMED = 512
EXTEND_WAYS = ("native", "sdpa")


def as_rows(meta: AttentionMetadata) -> bool:
    """Whether the native decode kernel takes this forward: a decode batch, or one whose
    every request brings at most ``SHORT_EXTEND`` tokens (drafted tokens being verified),
    each token a row of its own that sees its context up to itself. A drafted position then
    attends exactly as the decode step it saves would have."""
    return max(meta.extend_lens) <= SHORT_EXTEND


def store_rows(k: torch.Tensor, v: torch.Tensor, kv: LayerKV, out_slots: torch.Tensor) -> None:
    """``store_kv`` by the native copy where the native ops run and take the dtypes (the same
    bits: index_copy_ took two calls of 44-57 us a layer for a 512-token bfloat16 chunk of the
    default model, BENCHMARKS.md), by torch's elsewhere."""
    native = k.device.type == "cpu" and (k.dtype, kv.k.dtype) in NATIVE_DTYPES
    if native and cpu_ops.load():
        torch.ops.attest.store_kv(k, v, kv.k, kv.v, out_slots)
    else:
        store_kv(k, v, kv, out_slots)


class TorchReferenceBackend(AttentionBackend):
    name = "torch"

    def __init__(self, decode: str | None = None) -> None:
        """``decode``: a path of ``DECODE_PATHS``; None takes ``native`` where it is built."""
        if decode is None:
            decode = "native" if cpu_ops.load() else "grouped"
        if decode not in DECODE_PATHS:
            raise ValueError(f"decode path {decode!r}: choose one of {DECODE_PATHS}")
        if decode == "native" and not cpu_ops.load():
            raise ValueError(f"decode path 'native': {cpu_ops.why_not()}")
        self.decode = decode
        if decode == "padded":
            self.name = "torch-padded"
        self._buffers = IndexBuffers()
        # a prefill chunk's kernel where the native one can take it: native until ``prepare``
        # times the two; the microseconds each took, by way, once timed
        self._extend = "native"
        self._extend_us: dict[str, float] = {}

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv: LayerKV,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        native = self.decode == "native" and q.device.type == "cpu"
        if native and as_rows(meta):
            return self._decode_native(q, k, v, kv, meta, scale)  # it stores K/V itself
        store_rows(k, v, kv, meta.out_slots)
        if native and self._extends_natively(q, kv.k, meta):
            return self._extend_native(q, kv, meta, scale)
        if meta.is_decode:
            if self.decode == "padded":
                return self._decode_padded(q, kv, meta, scale)
            plan = meta.scratch.get("grouped")
            if plan is None:  # the same for every layer of this forward
                plan = build_plan(meta, kv.k.shape[1], kv.k.dtype, self._buffers)
                meta.scratch["grouped"] = plan
            return grouped_decode(q, kv.k, kv.v, plan, scale)
        return self._extend_sdpa(q, kv, meta, scale)

    def _extend_sdpa(
        self, q: torch.Tensor, kv: LayerKV, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        """An extend's attention by SDPA, each context gathered from the pool (``_extend_plan``);
        the new tokens' K/V already stored."""
        out = torch.empty_like(q)
        gqa = q.shape[1] != kv.k.shape[1]
        for start, n, ext, slots, mask, causal in self._extend_plan(meta):
            # [n, heads, len, head_dim] views for SDPA: n requests of ext tokens each
            rows = slice(start, start + n * ext)
            qi = q[rows].unflatten(0, (n, ext)).transpose(1, 2)
            if qi.stride(-1) != 1:  # a transposed product's rows: SDPA's flash kernel wants
                qi = qi.contiguous()  # a dense last dimension, else it takes the math path
            ki = kv.k.index_select(0, slots).unflatten(0, (n, -1)).transpose(1, 2).to(q.dtype)
            vi = kv.v.index_select(0, slots).unflatten(0, (n, -1)).transpose(1, 2).to(q.dtype)
            oi = F.scaled_dot_product_attention(
                qi, ki, vi, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
            )
            out[rows] = oi.transpose(1, 2).flatten(0, 1)
        return out

    @staticmethod
    def _decode_native(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv: LayerKV,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Store this step's K/V and attend, one native call: each row's context is read from
        the pool where it lies, with no gather and no GQA copy. The kernel stores every row's
        K/V before it attends, so a drafted row sees the rows before it."""
        slots, lens = native_slots(meta)  # q/k/v: views of the fused QKV product, by strides
        return torch.ops.attest.decode_attention(
            q, k, v, kv.k, kv.v, meta.out_slots, slots, lens, scale
        )

    def _extends_natively(
        self, q: torch.Tensor, pool_k: torch.Tensor, meta: AttentionMetadata | None = None
    ) -> bool:
        """Whether the native extend kernel takes a forward with a longer extend (a prefill
        chunk): where it can (``_native_extends``), and either was not timed slower than SDPA at
        boot (``prepare``) or the forward carries short extends too (decodes beside a chunk),
        which SDPA would attend one call per request and per layer, where the native kernel
        takes the whole batch in one."""
        if not self._native_extends(q, pool_k):
            return False
        mixed = meta is not None and min(meta.extend_lens) <= SHORT_EXTEND
        return self._extend == "native" or mixed

    @staticmethod
    def _native_extends(q: torch.Tensor, pool_k: torch.Tensor) -> bool:
        """Whether the native extend kernel can take a longer extend: a CPU with AVX-512, head
        sizes 64 and 128, up to 8 query heads a KV head, the dtypes the decode kernel takes."""
        heads, kv_heads = q.shape[1], pool_k.shape[1]
        dtypes = (q.dtype, pool_k.dtype)
        return (
            cpu_ops.vector_512()
            and q.shape[-1] in (64, 128)
            and heads % kv_heads == 0
            and heads // kv_heads <= 8
            and q.stride(-1) == 1
            and dtypes in NATIVE_DTYPES
        )

    def kernels(self, shape: HeadShape) -> dict[str, Any]:
        """Which kernels attend this model's heads on a CPU (``boot.weights``' ``attention``):
        a decode step's (the native kernel a KV head at a time, or by its general loops; the
        grouped or padded torch paths) and a prefill chunk's (native or SDPA, with what each
        took where ``prepare`` timed them)."""
        q, pool = self._probes(shape)
        if self.decode != "native":
            return {"decode": self.decode, "extend": "sdpa"}
        native = (shape.dtype, shape.kv_dtype) in NATIVE_DTYPES
        by_head = native and torch.ops.attest.decode_by_kv_head(q, pool)
        out = {
            "decode": f"native, {'a KV head at a time' if by_head else 'general loops'}",
            "extend": "native" if self._extends_natively(q, pool) else "sdpa",
        }
        if self._extend_us and self._native_extends(q, pool):
            out["extend_us"] = dict(self._extend_us)
        if out["extend"] == "native":
            out["extend_way"] = self._extend_way(q, pool)
        return out

    @staticmethod
    def _extend_way(q: torch.Tensor, pool_k: torch.Tensor) -> str:
        """How the native extend kernel attends this model's prefill chunks of 16 new tokens or
        more (``kernels/cpu_extend.cpp``): bfloat16 activations over a bfloat16 pool take the
        laid-out method, on AMX's bfloat16 tiles (``tiles``) or as AVX-512 BF16 pair products on
        vectors (``pairs``), as far as the CPU has them; other dtypes, or
        ``ATTEST_EXTEND_WAY=loops``, the item loops (``loops``)."""
        bf16 = q.dtype == pool_k.dtype == torch.bfloat16
        return str(torch.ops.attest.extend_way()) if bf16 else "loops"

    @staticmethod
    def _probes(shape: HeadShape, rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Random queries and a pool of ``rows`` rows of ``shape``'s heads and dtypes: what the
        native kernels' dispatch reads (and ``prepare`` times)."""
        q = torch.randn(rows, shape.heads, shape.head_dim).to(shape.dtype)
        return q, torch.randn(rows, shape.kv_heads, shape.head_dim).to(shape.kv_dtype)

    def prepare(self, shape: HeadShape) -> None:
        """Where the native extend kernel can take this model's prefill chunks, time it against
        SDPA over one fresh chunk of ``EXTEND_TIMED`` tokens (the two taking turns) and keep
        the faster. Which wins depends on the CPU: on an AMD EPYC (AVX-512 BF16, no AMX) the
        native kernel attended a bfloat16 prefill 1.8x faster; on an Intel Xeon with AMX, SDPA
        (whose flash kernel runs AMX tiles) made a 512-token bfloat16 prefill 1.4x faster than
        the native kernel's vector loops and a 2,048-token one 2.7x, until the native kernel ran
        bfloat16 chunks on the tiles too; in float32 the native kernel stayed 1.06x ahead
        (BENCHMARKS.md). ``ATTEST_EXTEND=native`` or ``sdpa`` fixes the way instead."""
        how = os.environ.get("ATTEST_EXTEND", "").strip()
        if how not in ("", "measure", *EXTEND_WAYS):
            raise ValueError(f"ATTEST_EXTEND must be native, sdpa or measure, got {how!r}")
        q, k = self._probes(shape, EXTEND_TIMED)
        kv = LayerKV(k, self._probes(shape, EXTEND_TIMED)[1])
        if self.decode != "native" or not self._native_extends(q, kv.k):
            return
        if how in EXTEND_WAYS:
            self._extend = how
            return
        slots = torch.arange(EXTEND_TIMED)
        meta = AttentionMetadata(
            req_to_token=slots[None],
            req_rows=[0],
            prefix_lens=[0],
            extend_lens=[EXTEND_TIMED],
            positions=slots,
            out_slots=slots,
        )
        scale = shape.head_dim**-0.5
        took = fastest_each(
            [
                lambda: self._extend_native(q, kv, meta, scale),
                lambda: self._extend_sdpa(q, kv, meta, scale),
            ]
        )
        self._extend_us = {w: round(t * 1e6, 1) for w, t in zip(EXTEND_WAYS, took)}
        self._extend = EXTEND_WAYS[took.index(min(took))]

    @staticmethod
    def _extend_native(
        q: torch.Tensor, kv: LayerKV, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        """Attend each new token to its request's context up to itself, read from the pool
        where it lies (no gather, no GQA copy): one native call per layer."""
        plan = meta.scratch.get("native_extend")
        if plan is None:  # the same for every layer of this forward
            dev = meta.req_to_token.device
            width = max(p + e for p, e in zip(meta.prefix_lens, meta.extend_lens))
            rows = torch.tensor(meta.req_rows, dtype=torch.int64, device=dev)
            starts = [0, *itertools.accumulate(meta.extend_lens)][:-1]
            plan = meta.scratch["native_extend"] = (
                meta.req_to_token[rows, :width],
                torch.tensor(meta.prefix_lens, dtype=torch.int64, device=dev),
                torch.tensor(starts, dtype=torch.int64, device=dev),
                torch.tensor(meta.extend_lens, dtype=torch.int64, device=dev),
            )
        return torch.ops.attest.extend_attention(q, kv.k, kv.v, *plan, scale)

    @staticmethod
    def _extend_plan(meta: AttentionMetadata) -> list[tuple]:
        """Per SDPA call: (first token, requests, new tokens each, their context slots, mask,
        causal). Adjacent requests with no prefix and the same number of new tokens (a batch of
        fresh prompts) share one call: SDPA attends each of a batch alone, so each gets the bits
        a call of its own gives, and one call spreads over the cores where a short prompt's
        does not. The same for every layer of this forward, so built once."""
        plan = meta.scratch.get("extend")
        if plan is not None:
            return plan
        plan, start = [], 0
        dev = meta.req_to_token.device
        for row, prefix, ext in zip(meta.req_rows, meta.prefix_lens, meta.extend_lens):
            ctx = prefix + ext
            slots = meta.req_to_token[row, :ctx]
            if plan and prefix == 0 and ext > 1 and plan[-1][2:3] == (ext,) and plan[-1][5]:
                first, n, _, before, _, _ = plan[-1]  # fresh prompts of one length: one call
                plan[-1] = (first, n + 1, ext, torch.cat([before, slots]), None, True)
                start += ext
                continue
            if ext == 1:
                mask, causal = None, False  # one query sees the whole context
            elif prefix == 0:
                mask, causal = None, True
            else:
                # query j (absolute position prefix + j) sees keys 0 ..= prefix + j
                mask = torch.ones(ext, ctx, dtype=torch.bool, device=dev).tril(prefix)
                causal = False
            plan.append((start, 1, ext, slots, mask, causal))
            start += ext
        meta.scratch["extend"] = plan
        return plan

    def _decode_padded(
        self, q: torch.Tensor, kv: LayerKV, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        """All decode requests in one padded call: [B, heads, 1, d] against [B, kv_heads, L, d],
        positions past each request's context masked out. One kernel call instead of B."""
        if "decode" not in meta.scratch:  # the same for every layer of this forward
            slots, lens = context_slots(meta)
            width = slots.shape[1]
            pos = torch.arange(width, device=slots.device)
            mask = (pos[None, :] < lens[:, None])[:, None, None, :]
            meta.scratch["decode"] = (slots.flatten(), mask, width)
        idx, mask, width = meta.scratch["decode"]
        heads, d = kv.k.shape[1], kv.k.shape[2]
        shape = (len(meta.req_rows), width, heads, d)
        # index_select on a flat index is several times faster than 2-D advanced indexing here
        k = kv.k.index_select(0, idx).view(shape).to(q.dtype).transpose(1, 2)  # [B, kvh, L, d]
        v = kv.v.index_select(0, idx).view(shape).to(q.dtype).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),
            k,
            v,
            attn_mask=mask,
            scale=scale,
            enable_gqa=q.shape[1] != kv.k.shape[1],
        )
        return out.squeeze(2)
