"""The online-softmax loops the Triton attention kernels are built from.

A request's context is read block by block through its row of the slot table, each block's
scores scaled into the log2 domain (``exp2``), and the running max, normalizer and unnormalized
output carried from block to block. Extend runs the loop for a block of one head's queries under
the causal rule; decode for the one query of each head of a KV head's group over a piece of the
context (the group shares its keys and values: they are read once for all its heads). Every
helper here is ``@triton.jit`` and inlined into the kernel that calls it, so splitting them out
costs the compiled kernels nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dot_f32(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in float32. ``IEEE``: float32 inputs multiply in full precision,
    never TF32. ``UPCAST``: half inputs are widened first; the interpreter (triton 3.9) gets a
    bfloat16 ``tl.dot`` wrong, and a product of two bfloat16 values is exact in float32 anyway,
    so the widened dot is the same arithmetic the GPU's half dot does."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def load_tile(X, rows, stride_t, head_off, offs_d, mask):
    """A [len(rows), BLOCK_D] tile of one head of a ``[rows, heads, head_dim]`` tensor: pool
    slots of a KV head, or a request's queries (masked: 0)."""
    return tl.load(X + rows[:, None] * stride_t + head_off + offs_d[None, :], mask=mask, other=0.0)


@triton.jit
def slot_block(TableRow, n0, end, BLOCK_N: tl.constexpr):
    """Context positions ``[n0, n0 + BLOCK_N)`` of one request, which of them are before
    ``end``, and their pool slots (0 past ``end``), read from its row of the slot table."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    nmask = offs_n < end
    slots = tl.load(TableRow + offs_n, mask=nmask, other=0).to(tl.int64)
    return offs_n, nmask, slots


@triton.jit
def block_attend(
    q,  # [BLOCK_M, BLOCK_D] queries of one request: a block of its new tokens at one head
    # (extend), or its one new token at each query head of a KV head's group (decode)
    q_pos,  # [BLOCK_M] absolute position of each query (read only where CAUSAL)
    TableRow,  # the request's row of the slot table
    kv_start,
    kv_end,  # keys at context positions [kv_start, kv_end)
    KPool,
    VPool,
    k_off,  # offset of the KV head within a slot of each pool
    v_off,
    stride_kt,
    stride_vt,
    offs_d,
    dmask,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """Online softmax of a block of queries over ``[kv_start, kv_end)``, where CAUSAL each query
    seeing keys at positions up to its own: ``(acc, l, m)``, the unnormalized output, its
    normalizer and the running max of the scaled (log2) scores. The block's keys are read once
    for all its queries, and both products are ``tl.dot``s."""
    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n0 in range(kv_start, kv_end, BLOCK_N):
        offs_n, nmask, slots = slot_block(TableRow, n0, kv_end, BLOCK_N)
        kvmask = nmask[:, None] & dmask[None, :]
        k = load_tile(KPool, slots, stride_kt, k_off, offs_d, kvmask).to(q.dtype)
        scores = dot_f32(q, tl.trans(k), IEEE, UPCAST)
        if CAUSAL:
            allowed = (offs_n[None, :] <= q_pos[:, None]) & nmask[None, :]
        else:
            allowed = tl.broadcast_to(nmask[None, :], (BLOCK_M, BLOCK_N))
        scores = tl.where(allowed, scores * qk_scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # rows past the request's end may see no key at all: keep them finite, never stored
        m_new = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        v = load_tile(VPool, slots, stride_vt, v_off, offs_d, kvmask).to(q.dtype)
        pv = dot_f32(p.to(v.dtype), v, IEEE, UPCAST)
        acc = acc * alpha[:, None] + pv
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    return acc, l_i, m_i
