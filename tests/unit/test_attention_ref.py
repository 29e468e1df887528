"""The torch reference attention backend against a naive, independent implementation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from kernels.attention import AttentionMetadata, LayerKV
from kernels.select import get_backend
from kernels.torch_ref import TorchReferenceBackend

PREFILL = [(0, 5), (0, 1), (0, 9)]  # (prefix, extend) per request
EXTEND = [(3, 4), (7, 2), (0, 5), (10, 1), (1, 6)]
DECODE = [(5, 1), (1, 1), (12, 1), (0, 1)]
GQA = [(4, 4), (4, 2), (6, 2)]  # (heads, kv_heads): ratios 1, 2, 3


@dataclass
class Batch:
    q: torch.Tensor  # [T, H, D]
    k: torch.Tensor  # [T, KVH, D] new tokens only
    v: torch.Tensor
    kv: LayerKV
    meta: AttentionMetadata
    ctx_k: list[torch.Tensor]  # per request, its whole context [ctx, KVH, D] (prefix + new)
    ctx_v: list[torch.Tensor]
    scale: float


def make_batch(
    spec: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Batch:
    """A ragged batch whose contexts live at shuffled, non-contiguous slots of a KV pool that
    is otherwise full of garbage, in shuffled rows of a wider slot table."""
    g = torch.Generator().manual_seed(seed)
    n_ctx = sum(p + e for p, e in spec)
    n_slots = 2 * n_ctx + 3  # half the pool is never used by this batch
    slot_order = (torch.randperm(n_slots, generator=g) + 1).tolist()  # slot 0 is padding
    rows = torch.randperm(len(spec) + 3, generator=g).tolist()
    width = max(p + e for p, e in spec) + 4

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    kv = LayerKV(k=rand(n_slots + 1, kv_heads, head_dim), v=rand(n_slots + 1, kv_heads, head_dim))
    table = torch.zeros(len(rows), width, dtype=torch.int64)
    ctx_k, ctx_v, new_k, new_v, positions, out_slots = [], [], [], [], [], []
    for i, (prefix, ext) in enumerate(spec):
        ctx = prefix + ext
        slots = torch.tensor(slot_order[:ctx], dtype=torch.int64)
        del slot_order[:ctx]
        table[rows[i], :ctx] = slots
        ck, cv = rand(ctx, kv_heads, head_dim), rand(ctx, kv_heads, head_dim)
        kv.k[slots[:prefix]] = ck[:prefix]  # the cached prefix, written by an earlier forward
        kv.v[slots[:prefix]] = cv[:prefix]
        ctx_k.append(ck)
        ctx_v.append(cv)
        new_k.append(ck[prefix:])
        new_v.append(cv[prefix:])
        positions.append(torch.arange(prefix, ctx))
        out_slots.append(slots[prefix:])
    meta = AttentionMetadata(
        req_to_token=table,
        req_rows=rows[: len(spec)],
        prefix_lens=[p for p, _ in spec],
        extend_lens=[e for _, e in spec],
        positions=torch.cat(positions),
        out_slots=torch.cat(out_slots),
    )
    meta.validate()
    q = rand(meta.num_tokens, heads, head_dim) * 2  # a little peakier than unit scores
    return Batch(
        q=q,
        k=torch.cat(new_k),
        v=torch.cat(new_v),
        kv=kv,
        meta=meta,
        ctx_k=ctx_k,
        ctx_v=ctx_v,
        scale=1 / math.sqrt(head_dim),
    )


def naive_attention(b: Batch, *, mask_shift: int = 0, ignore_prefix: bool = False) -> torch.Tensor:
    """Independent of the pool and the slot table: every request's context K/V is given whole.
    Query at absolute position p sees keys at positions <= p (+ mask_shift when deliberately
    wrong); GQA by repeating each KV head for its group of query heads. Float64 throughout."""
    heads = b.q.shape[1]
    out = []
    start = 0
    for i, (prefix, ext) in enumerate(zip(b.meta.prefix_lens, b.meta.extend_lens)):
        q = b.q[start : start + ext].double()  # [ext, H, D]
        k, v = b.ctx_k[i].double(), b.ctx_v[i].double()  # [ctx, KVH, D]
        group = heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1)  # [ctx, H, D]: query head h uses kv head h//group
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * b.scale  # [H, ext, ctx]
        q_pos = torch.arange(prefix, prefix + ext)[:, None]
        k_pos = torch.arange(prefix + ext)[None, :]
        allowed = k_pos <= q_pos + mask_shift
        if ignore_prefix:
            allowed = allowed & (k_pos >= prefix)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out.append(torch.einsum("hqk,khd->qhd", probs, v))
        start += ext
    return torch.cat(out)


TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize(("heads", "kv_heads"), GQA, ids=["mha", "gqa2", "gqa3"])
@pytest.mark.parametrize("spec", [PREFILL, EXTEND, DECODE], ids=["prefill", "extend", "decode"])
def test_reference_matches_naive_attention(spec, heads, kv_heads, head_dim, dtype):
    b = make_batch(spec, heads, kv_heads, head_dim, dtype, seed=head_dim + heads + kv_heads)
    untouched = torch.ones(b.kv.k.shape[0], dtype=torch.bool)
    untouched[b.meta.out_slots] = False
    before_k, before_v = b.kv.k[untouched].clone(), b.kv.v[untouched].clone()

    out = TorchReferenceBackend().forward(b.q, b.k, b.v, b.kv, b.meta, b.scale)

    assert out.shape == b.q.shape and out.dtype == dtype
    want = naive_attention(b)
    torch.testing.assert_close(out.double(), want, **TOL[dtype])
    # the new tokens' K/V are in the pool at out_slots, and nothing else was written
    assert torch.equal(b.kv.k[b.meta.out_slots], b.k)
    assert torch.equal(b.kv.v[b.meta.out_slots], b.v)
    assert torch.equal(b.kv.k[untouched], before_k)
    assert torch.equal(b.kv.v[untouched], before_v)


def test_get_backend_torch_is_the_reference():
    assert isinstance(get_backend("torch"), TorchReferenceBackend)
    with pytest.raises(ValueError, match="'nope' is not available"):
        get_backend("nope")


# -- consistency across chunking --------------------------------------------------------------


@pytest.mark.parametrize(("heads", "kv_heads"), GQA, ids=["mha", "gqa2", "gqa3"])
def test_one_prefill_equals_prefill_then_extend_then_decodes(heads, kv_heads):
    """A 13-token sequence computed at once, and as 5 prefill + 4 extend + 4 decodes (with an
    unrelated request riding along in the extend step) gives the same output per position."""
    length, head_dim = 13, 32
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    q = torch.randn(length, heads, head_dim, generator=g)
    k = torch.randn(length, kv_heads, head_dim, generator=g)
    v = torch.randn(length, kv_heads, head_dim, generator=g)
    scale = 1 / math.sqrt(head_dim)
    backend = TorchReferenceBackend()
    slots = (torch.randperm(40, generator=g)[:length] + 1).to(torch.int64)
    other_slots = torch.tensor([41, 43, 45], dtype=torch.int64)

    def fresh() -> tuple[LayerKV, torch.Tensor]:
        kv = LayerKV(k=torch.randn(46, kv_heads, head_dim), v=torch.randn(46, kv_heads, head_dim))
        table = torch.zeros(3, 16, dtype=torch.int64)
        table[2, :length] = slots
        table[0, :3] = other_slots
        return kv, table

    def meta(table: torch.Tensor, reqs: list[tuple[int, int, int, torch.Tensor]]):
        # reqs: (row, prefix, extend, that request's slots)
        return AttentionMetadata(
            req_to_token=table,
            req_rows=[r for r, *_ in reqs],
            prefix_lens=[p for _, p, _, _ in reqs],
            extend_lens=[e for _, _, e, _ in reqs],
            positions=torch.cat([torch.arange(p, p + e) for _, p, e, _ in reqs]),
            out_slots=torch.cat([s[p : p + e] for _, p, e, s in reqs]),
        )

    kv, table = fresh()
    whole = backend.forward(q, k, v, kv, meta(table, [(2, 0, length, slots)]), scale)

    kv, table = fresh()
    pieces = [backend.forward(q[:5], k[:5], v[:5], kv, meta(table, [(2, 0, 5, slots)]), scale)]
    oq = torch.randn(3, heads, head_dim, generator=g)
    ok, ov = torch.randn(3, kv_heads, head_dim), torch.randn(3, kv_heads, head_dim)
    mixed = backend.forward(
        torch.cat([oq, q[5:9]]),
        torch.cat([ok, k[5:9]]),
        torch.cat([ov, v[5:9]]),
        kv,
        meta(table, [(0, 0, 3, other_slots), (2, 5, 4, slots)]),
        scale,
    )
    pieces.append(mixed[3:])
    for pos in range(9, length):
        sl = slice(pos, pos + 1)
        m = meta(table, [(2, pos, 1, slots)])
        assert m.is_decode
        pieces.append(backend.forward(q[sl], k[sl], v[sl], kv, m, scale))
    chunked = torch.cat(pieces)

    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)
    assert torch.equal(kv.k[slots], k) and torch.equal(kv.v[slots], v)


# -- the comparison can fail ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "wrong"),
    [
        (PREFILL, {"mask_shift": 1}),
        (EXTEND, {"mask_shift": 1}),
        (EXTEND, {"ignore_prefix": True}),
        (DECODE, {"ignore_prefix": True}),
    ],
    ids=["prefill-shifted", "extend-shifted", "extend-no-prefix", "decode-no-prefix"],
)
def test_a_wrong_mask_is_detected(spec, wrong):
    """The naive comparison is sensitive: a mask off by one position, or one that forgets the
    cached prefix, is far outside the tolerance the real comparison uses."""
    b = make_batch(spec, 4, 2, 16, seed=7)
    out = TorchReferenceBackend().forward(b.q, b.k, b.v, b.kv, b.meta, b.scale)
    torch.testing.assert_close(out.double(), naive_attention(b), **TOL[torch.float32])
    bad = naive_attention(b, **wrong)
    assert not torch.allclose(out.double(), bad, **TOL[torch.float32])
    assert float((out.double() - bad).abs().max()) > 0.05


def test_reading_a_stale_slot_is_detected():
    """If the pool held something else at a prefix slot, the output changes: the backend reads
    the prefix through the table rather than from anywhere else."""
    b = make_batch(EXTEND, 4, 4, 16, seed=3)
    row, prefix = b.meta.req_rows[0], b.meta.prefix_lens[0]
    b.kv.k[b.meta.req_to_token[row, prefix - 1]] += 5.0
    out = TorchReferenceBackend().forward(b.q, b.k, b.v, b.kv, b.meta, b.scale)
    first = b.meta.extend_lens[0]
    assert not torch.allclose(out[:first].double(), naive_attention(b)[:first], atol=1e-3)
    # the other requests are untouched by it
    torch.testing.assert_close(
        out[first:].double(), naive_attention(b)[first:], atol=1e-5, rtol=1e-5
    )


# -- AttentionMetadata.validate ---------------------------------------------------------------


def _meta(**over) -> AttentionMetadata:
    base = dict(
        req_to_token=torch.zeros(4, 8, dtype=torch.int64),
        req_rows=[0, 2],
        prefix_lens=[0, 3],
        extend_lens=[2, 1],
        positions=torch.tensor([0, 1, 3]),
        out_slots=torch.tensor([1, 2, 3]),
    )
    base.update(over)
    return AttentionMetadata(**base)


def test_validate_accepts_a_consistent_batch():
    m = _meta()
    m.validate()
    assert m.num_tokens == 3 and not m.is_decode
    assert _meta(
        extend_lens=[1, 1], positions=torch.tensor([0, 3]), out_slots=torch.tensor([1, 2])
    ).is_decode


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"req_rows": [0]}, "one entry per request"),
        ({"prefix_lens": [0, 3, 1]}, "one entry per request"),
        ({"extend_lens": [3]}, "one entry per request"),
        ({"positions": torch.tensor([0, 1])}, "positions has 2"),
        ({"out_slots": torch.tensor([1, 2, 3, 4])}, "out_slots 4"),
        ({"extend_lens": [3, 1]}, "extend_lens sum to 4"),
        ({"prefix_lens": [0, 8]}, "8+1 outside the slot table width 8"),
        ({"prefix_lens": [-1, 3]}, "-1+2 outside"),
        (
            {"extend_lens": [3, 0], "positions": torch.tensor([0, 1, 2])},
            "3+0 outside",
        ),
    ],
)
def test_validate_rejects_inconsistent_lengths(over, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        _meta(**over).validate()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fresh_prompts_of_one_length_share_a_call_and_keep_their_bits(dtype, monkeypatch):
    """Adjacent prompts with no prefix and the same length are attended in one SDPA call; each
    gets the bits it gets attended alone, and the naive attention's numbers."""
    import kernels.torch_ref as ref

    spec = [(0, 6), (0, 6), (0, 6), (3, 4), (0, 6), (0, 6), (0, 5), (0, 1)]
    b = make_batch(spec, 6, 2, 64, dtype, seed=3)
    calls = []
    sdpa = ref.F.scaled_dot_product_attention
    monkeypatch.setattr(
        ref.F,
        "scaled_dot_product_attention",
        lambda *a, **k: calls.append(a[0].shape[0]) or sdpa(*a, **k),
    )
    out = TorchReferenceBackend("grouped").forward(b.q, b.k, b.v, b.kv, b.meta, b.scale)
    assert calls == [3, 1, 2, 1, 1]  # the three of 6, the extend, the two of 6, 5, the one token
    torch.testing.assert_close(out.double(), naive_attention(b), **TOL[dtype])
    start = 0
    for i, (prefix, ext) in enumerate(spec):
        meta = AttentionMetadata(
            req_to_token=b.meta.req_to_token,
            req_rows=[b.meta.req_rows[i]],
            prefix_lens=[prefix],
            extend_lens=[ext],
            positions=b.meta.positions[start : start + ext],
            out_slots=b.meta.out_slots[start : start + ext],
        )
        rows = slice(start, start + ext)
        alone = TorchReferenceBackend("grouped").forward(
            b.q[rows], b.k[rows], b.v[rows], b.kv, meta, b.scale
        )
        assert torch.equal(alone, out[rows]), f"request {i}"
        start += ext
