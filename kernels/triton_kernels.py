"""Triton kernels over the paged KV pool: store new K/V, split-context decode, extend.

The pool is ``[slots, kv_heads, head_dim]`` per layer and K/V are read through the request's row
of the slot table, one token slot at a time, so any page size (including 1) is the same kernel.
Every kernel accumulates in float32 and writes in the output's dtype. The online-softmax loops
the attention kernels share live in ``kernels.triton_softmax``.

Whether these run compiled (CUDA) or under Triton's interpreter (CPU tensors) is fixed when this
module is imported: ``TRITON_INTERPRET=1`` at import time selects the interpreter.
``INTERPRETED`` records which one this process got.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from kernels.triton_softmax import block_attend, load_tile

LOG2E = 1.4426950408889634  # scores are scaled by log2(e) so the kernels can use exp2


@triton.jit
def _store_kv_kernel(
    K,  # [T, kv_heads, head_dim] new keys
    V,
    KPool,  # [slots, kv_heads, head_dim]
    VPool,
    Slots,  # [T] the slot of each new token
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_pkt,
    stride_pkh,
    stride_pvt,
    stride_pvh,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(Slots + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    src_k = K + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    src_v = V + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    dst_k = KPool + slot * stride_pkt + offs_h[:, None] * stride_pkh + offs_d[None, :]
    dst_v = VPool + slot * stride_pvt + offs_h[:, None] * stride_pvh + offs_d[None, :]
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    tl.store(dst_k, k.to(KPool.dtype.element_ty), mask=mask)
    tl.store(dst_v, v.to(VPool.dtype.element_ty), mask=mask)


@triton.jit
def _decode_split_kernel(
    Q,  # [B, heads, head_dim]: one query per request
    KPool,
    VPool,
    Table,  # [rows, width] int64 slot table
    Rows,  # [B] the table row of each request
    Lens,  # [B] context length of each request (prefix + the new token)
    PartO,  # [B, heads, splits, head_dim] float32: each split's normalized output
    PartLse,  # [B, heads, splits] float32: each split's log2-sum-exp2 of scaled scores
    qk_scale,  # softmax scale * log2(e)
    num_splits,
    stride_qb,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_table,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,  # GROUP rounded up to what tl.dot takes (16 at least)
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # one program per (request, KV head, piece of the context): the group's query heads read
    # the piece's keys and values once, as rows of one tile
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    row = tl.load(Rows + b).to(tl.int64)
    length = tl.load(Lens + b)
    per_split = tl.cdiv(length, num_splits)
    start = s * per_split
    end = tl.minimum(start + per_split, length)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    gdmask = (offs_g < GROUP)[:, None] & dmask[None, :]
    q = load_tile(Q + b * stride_qb, heads, stride_qh, 0, offs_d, gdmask)
    acc, l_i, m_i = block_attend(
        q,
        offs_g,
        Table + row * stride_table,
        start,
        end,
        KPool,
        VPool,
        kvh * stride_kh,
        kvh * stride_vh,
        stride_kt,
        stride_vt,
        offs_d,
        dmask,
        qk_scale,
        BLOCK_G,
        BLOCK_D,
        BLOCK_N,
        IEEE,
        UPCAST,
        False,
    )
    # an empty split (a context shorter than the split count) contributes nothing: lse = -inf
    has = end > start
    lse = tl.where(has, m_i + tl.log2(tl.maximum(l_i, 1e-30)), -float("inf"))
    out = tl.where(has, acc / tl.maximum(l_i, 1e-30)[:, None], 0.0)
    dst = PartO + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + offs_d[None, :]
    tl.store(dst, out, mask=gdmask)
    tl.store(PartLse + b * stride_lb + heads * stride_lh + s, lse, mask=offs_g < GROUP)


@triton.jit
def _decode_reduce_kernel(
    PartO,
    PartLse,
    Out,  # [B, heads, head_dim]
    num_splits,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_outb,
    stride_outh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    smask = offs_s < num_splits
    dmask = offs_d < HEAD_DIM
    lse = tl.load(PartLse + b * stride_lb + h * stride_lh + offs_s, mask=smask, other=-float("inf"))
    parts = tl.load(
        PartO + b * stride_ob + h * stride_oh + offs_s[:, None] * stride_os + offs_d[None, :],
        mask=smask[:, None] & dmask[None, :],
        other=0.0,
    )
    w = tl.exp2(lse - tl.max(lse, 0))  # split 0 always holds a token, so the max is finite
    out = tl.sum(w[:, None] * parts, 0) / tl.sum(w, 0)
    tl.store(
        Out + b * stride_outb + h * stride_outh + offs_d, out.to(Out.dtype.element_ty), mask=dmask
    )


@triton.jit
def _extend_kernel(
    Q,  # [T, heads, head_dim]: the new tokens of every request, end to end
    KPool,
    VPool,
    Out,  # [T, heads, head_dim]
    Table,
    Rows,  # [R] table row per request
    PrefixLens,  # [R]
    ExtendLens,  # [R]
    QStart,  # [R] index of each request's first new token in Q
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_table,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    ext = tl.load(ExtendLens + r)
    kvh = h // GROUP
    prefix = tl.load(PrefixLens + r)
    q0 = tl.load(QStart + r).to(tl.int64)
    row = tl.load(Rows + r).to(tl.int64)

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    mdmask = (offs_m < ext)[:, None] & dmask[None, :]
    q = load_tile(Q, q0 + offs_m, stride_qt, h * stride_qh, offs_d, mdmask)
    # keys at positions [0, kv_end): the cached prefix, then new tokens up to this block's last
    kv_end = tl.minimum(prefix + ext, prefix + (mb + 1) * BLOCK_M)
    # a block past this request's last query (the grid is sized for the longest) reads nothing
    # and stores nothing; masks rather than an early return, which older compilers refuse
    kv_end = tl.where(mb * BLOCK_M < ext, kv_end, 0)
    acc, l_i, _ = block_attend(
        q,
        prefix + offs_m,
        Table + row * stride_table,
        0,
        kv_end,
        KPool,
        VPool,
        kvh * stride_kh,
        kvh * stride_vh,
        stride_kt,
        stride_vt,
        offs_d,
        dmask,
        qk_scale,
        BLOCK_M,
        BLOCK_D,
        BLOCK_N,
        IEEE,
        UPCAST,
        True,
    )
    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    dst = Out + (q0 + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(dst, out.to(Out.dtype.element_ty), mask=mdmask)


INTERPRETED = isinstance(_decode_split_kernel, InterpretedFunction)


# -- launchers ---------------------------------------------------------------------------------


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    """The kernels step along head_dim by one element (a transposed GEMM output is copied)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_pool(k_pool: torch.Tensor, v_pool: torch.Tensor) -> None:
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError("the KV pool needs a unit stride along head_dim")


def _block_d(head_dim: int) -> int:
    return max(16, _pow2(head_dim))  # tl.dot needs at least 16 along every axis


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """``k_pool[slots[t]] = k[t]`` (and V), cast to the pool's dtype."""
    t, kv_heads, head_dim = k.shape
    if t == 0:
        return
    # a dtype change is done by torch (round to nearest even; the interpreter's in-kernel
    # float32 -> bfloat16 conversion truncates), so the kernel itself only copies
    k, v = _unit_last(k.to(k_pool.dtype)), _unit_last(v.to(v_pool.dtype))
    _check_pool(k_pool, v_pool)
    _store_kv_kernel[(t,)](
        k,
        v,
        k_pool,
        v_pool,
        slots,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        KV_HEADS=kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=_pow2(kv_heads),
        BLOCK_D=_pow2(head_dim),
    )


def decode_splits(max_len: int, max_splits: int = 16, min_tokens: int = 64) -> int:
    """How many pieces each request's context is cut into: enough programs to fill a GPU at
    small batch, never pieces shorter than ``min_tokens``."""
    return max(1, min(max_splits, math.ceil(max_len / min_tokens)))


def decode_attention(
    q: torch.Tensor,  # [B, heads, head_dim]
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    rows: torch.Tensor,  # [B]
    lens: torch.Tensor,  # [B] int32/int64, >= 1
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
    part_o: torch.Tensor | None = None,
    part_lse: torch.Tensor | None = None,
    block_n: int = 32,
) -> torch.Tensor:
    """One query per request over its whole context, flash-decoding style: each of
    ``num_splits`` programs per (request, KV head) reduces a piece of the context to a partial
    output and its log-sum-exp for every query head of the KV head's group (the piece's keys and
    values read once for them all); a second kernel merges the pieces."""
    q = _unit_last(q)
    _check_pool(k_pool, v_pool)
    b, heads, head_dim = q.shape
    kv_heads = k_pool.shape[1]
    out = torch.empty_like(q) if out is None else out
    if part_o is None:
        part_o = torch.empty(b, heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    if part_lse is None:
        part_lse = torch.empty(b, heads, num_splits, dtype=torch.float32, device=q.device)
    group = heads // kv_heads
    _decode_split_kernel[(b, kv_heads, num_splits)](
        q,
        k_pool,
        v_pool,
        table,
        rows,
        lens,
        part_o,
        part_lse,
        scale * LOG2E,
        num_splits,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        table.stride(0),
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_G=max(16, _pow2(group)),
        BLOCK_D=_block_d(head_dim),
        BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32,
        UPCAST=INTERPRETED and q.dtype != torch.float32,
    )
    _decode_reduce_kernel[(b, heads)](
        part_o,
        part_lse,
        out,
        num_splits,
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_D=_pow2(head_dim),
        BLOCK_S=_pow2(num_splits),
    )
    return out


def extend_attention(
    q: torch.Tensor,  # [T, heads, head_dim]
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    rows: torch.Tensor,  # [R]
    prefix_lens: torch.Tensor,  # [R]
    extend_lens: torch.Tensor,  # [R]
    q_start: torch.Tensor,  # [R]
    max_extend: int,
    scale: float,
    out: torch.Tensor | None = None,
    block_m: int = 32,
    block_n: int = 32,
) -> torch.Tensor:
    """New tokens attend causally to themselves and fully to their cached prefix; all K/V
    (the new tokens' too, stored first) are read from the pool through the slot table."""
    q = _unit_last(q)
    _check_pool(k_pool, v_pool)
    t, heads, head_dim = q.shape
    kv_heads = k_pool.shape[1]
    out = torch.empty_like(q) if out is None else out
    r = int(rows.shape[0])
    grid = (r, heads, triton.cdiv(max_extend, block_m))
    _extend_kernel[grid](
        q,
        k_pool,
        v_pool,
        out,
        table,
        rows,
        prefix_lens,
        extend_lens,
        q_start,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        out.stride(0),
        out.stride(1),
        table.stride(0),
        GROUP=heads // kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=_block_d(head_dim),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32,
        UPCAST=INTERPRETED and q.dtype != torch.float32,
    )
    return out
