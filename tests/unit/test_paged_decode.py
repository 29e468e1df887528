"""The native decode (kernels/cpu_ops.cpp) and the grouped paged decode (kernels.paged_decode)
against the padded SDPA decode they replaced, on random page tables: GQA ratios 1 to 4, pages of
1 and 4 slots, ragged contexts (some of one token), float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernels import cpu_ops
from kernels.attention import AttentionMetadata, HeadShape
from kernels.paged_decode import IndexBuffers, build_plan, grouped_decode
from kernels.select import get_backend
from kernels.torch_ref import TorchReferenceBackend
from tests.unit.paged_batch import make_paged_batch

GQA = [(4, 4), (4, 2), (9, 3), (8, 2)]  # ratios 1, 2, 3 (the default model's), 4
# fp32: the two paths sum in different orders; one element in 2,560 differed by 3.5e-6 (GQA 8/2,
# head_dim 64), while the bugs this test caught (a dropped group mapping, an off-by-one mask,
# every query reading KV head 0) differ by more than 1e-2
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


NATIVE = pytest.param(
    "native", marks=pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))
)
PATHS = [NATIVE, "grouped"]


# random decode batches: GQA ratio, page size, contexts (one request or several), head size
BATCHES = dict(
    gqa=st.sampled_from(GQA),
    page_size=st.sampled_from([1, 4]),
    lens=st.lists(st.integers(0, 40), min_size=1, max_size=9),
    head_dim=st.sampled_from([16, 64]),
    seed=st.integers(0, 2**16),
)


def both_paths(b, path: str = "grouped") -> tuple[torch.Tensor, torch.Tensor]:
    """(``path``, padded) outputs of one decode batch, each from its own copy of the pool."""
    kv_g, kv_p = b.pool_copy(), b.pool_copy()
    got = TorchReferenceBackend(path).forward(b.q, b.k, b.v, kv_g, b.meta, b.scale)
    want = TorchReferenceBackend("padded").forward(b.q, b.k, b.v, kv_p, b.meta, b.scale)
    assert torch.equal(kv_g.k, kv_p.k) and torch.equal(kv_g.v, kv_p.v)  # the same writes
    return got, want


@settings(max_examples=60, deadline=None)
@given(**BATCHES)
@example(gqa=(8, 2), page_size=1, lens=[18, 40, 15, 0, 40], head_dim=64, seed=37317)
def test_grouped_decode_equals_the_padded_reference(gqa, page_size, lens, head_dim, seed):
    check_against_padded("grouped", gqa, page_size, lens, head_dim, seed)


@pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))
@settings(max_examples=60, deadline=None)
@given(**BATCHES)
@example(gqa=(9, 3), page_size=1, lens=[0], head_dim=64, seed=1)  # one request: heads split
def test_native_decode_equals_the_padded_reference(gqa, page_size, lens, head_dim, seed):
    check_against_padded("native", gqa, page_size, lens, head_dim, seed)


def check_against_padded(path, gqa, page_size, lens, head_dim, seed) -> None:
    heads, kv_heads = gqa
    b = make_paged_batch(
        [(p, 1) for p in lens], heads, kv_heads, head_dim, torch.float32, page_size, seed
    )
    got, want = both_paths(b, path)
    assert got.shape == want.shape == b.q.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize(("heads", "kv_heads"), GQA, ids=["mha", "gqa2", "gqa3", "gqa4"])
def test_bfloat16_pool_and_queries(heads, kv_heads, page_size, path):
    spec = [(17, 1), (0, 1), (33, 1), (5, 1)]
    b = make_paged_batch(spec, heads, kv_heads, 64, torch.bfloat16, page_size, seed=heads)
    got, want = both_paths(b, path)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), **TOL[torch.bfloat16])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("requests", [1, 2])
def test_each_query_head_reads_its_own_kv_head(path, requests):
    """Query head ``h`` uses KV head ``h // group``: changing KV head 1 of the pool moves the
    outputs of query heads 3..5 (group 3) and of no other head."""
    b = make_paged_batch([(20, 1), (7, 1)][:requests], 9, 3, 16, seed=5)
    kv = b.pool_copy()
    backend = TorchReferenceBackend(path)
    before = backend.forward(b.q, b.k, b.v, kv, b.meta, b.scale)
    kv.k[:, 1] *= -1.0
    after = backend.forward(b.q, b.k, b.v, kv, b.meta, b.scale)
    moved = (after - before).abs().amax(dim=(0, 2)) > 1e-3
    assert moved.tolist() == [False] * 3 + [True] * 3 + [False] * 3


def test_the_plan_masks_past_each_context_and_reuses_its_buffers():
    b = make_paged_batch([(3, 1), (9, 1)], 4, 2, 16, page_size=4, seed=1)
    buffers = IndexBuffers()
    plan = build_plan(b.meta, 2, torch.float32, buffers)
    assert plan.width == 10 and plan.rows.numel() == 2 * 2 * 10
    assert torch.isinf(plan.bias[0, 0, 0, 4:]).all() and (plan.bias[0, 0, 0, :4] == 0).all()
    assert (plan.bias[1] == 0).all()
    table = b.meta.req_to_token
    first = table[b.meta.req_rows[0], :10]
    assert plan.rows.view(2, 2, 10)[0, 1].tolist() == (first * 2 + 1).tolist()
    again = build_plan(b.meta, 2, torch.float32, buffers)
    assert again.rows.data_ptr() == plan.rows.data_ptr()  # the same storage, refilled
    out = grouped_decode(b.q, b.kv.k, b.kv.v, plan, b.scale)
    assert out.shape == b.q.shape


def test_the_padded_path_stays_selectable():
    assert get_backend("torch").decode == ("native" if cpu_ops.load() else "grouped")
    padded = get_backend("torch-padded")
    assert padded.decode == "padded" and padded.name == "torch-padded"
    with pytest.raises(ValueError, match="decode path 'fast'"):
        TorchReferenceBackend("fast")


@pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))
def test_native_decode_reads_q_k_v_as_views_of_the_fused_product():
    """The forward hands the backend row-strided views of one QKV product; the native op reads
    them by their strides and matches the same values made contiguous."""
    b = make_paged_batch([(12, 1), (30, 1), (0, 1)], 9, 3, 64, seed=11)
    fused = torch.cat([b.q.flatten(1), b.k.flatten(1), b.v.flatten(1)], dim=1)
    q, k, v = fused.split([9 * 64, 3 * 64, 3 * 64], dim=1)
    q, k, v = q.view(3, 9, 64), k.view(3, 3, 64), v.view(3, 3, 64)
    assert q.stride(0) == 15 * 64  # strided rows, as the forward makes them
    # and transposed, as a product of several rows comes back: last dim strided
    cols = fused.t().contiguous().t()
    qt, kt, vt = cols.split([9 * 64, 3 * 64, 3 * 64], dim=1)
    qt, kt, vt = qt.view(3, 9, 64), kt.view(3, 3, 64), vt.view(3, 3, 64)
    assert qt.stride(-1) == 3
    native = TorchReferenceBackend("native")
    want_kv = b.pool_copy()
    want = native.forward(b.q, b.k, b.v, want_kv, b.meta, b.scale)
    for views in ((q, k, v), (qt, kt, vt)):
        kv = b.pool_copy()
        got = native.forward(*views, kv, b.meta, b.scale)
        assert (
            torch.equal(got, want) and torch.equal(kv.k, want_kv.k) and torch.equal(kv.v, want_kv.v)
        )


@pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))
def test_native_decode_refuses_a_context_longer_than_its_slot_row():
    b = make_paged_batch([(5, 1)], 4, 2, 16, seed=2)
    slots = b.meta.req_to_token[b.meta.req_rows, :6]
    with pytest.raises(RuntimeError, match="context length 7 outside 1..6"):
        torch.ops.attest.decode_attention(
            b.q, b.k, b.v, b.kv.k, b.kv.v, b.meta.out_slots, slots, torch.tensor([7]), b.scale
        )


@pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))
@settings(max_examples=40, deadline=None)
@given(
    gqa=st.sampled_from(GQA),
    page_size=st.sampled_from([1, 4]),
    spec=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6)), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_short_extends_attended_row_by_row_equal_the_extend_path(gqa, page_size, spec, seed):
    """Drafted tokens under verification (a few new tokens a request, after a prefix) take the
    native kernel a row per token; they match SDPA's causal extend over the gathered context."""
    b = make_paged_batch(spec, gqa[0], gqa[1], 64, page_size=page_size, seed=seed)
    kv_n, kv_s = b.pool_copy(), b.pool_copy()
    got = TorchReferenceBackend("native").forward(b.q, b.k, b.v, kv_n, b.meta, b.scale)
    want = TorchReferenceBackend("grouped").forward(b.q, b.k, b.v, kv_s, b.meta, b.scale)
    assert torch.equal(kv_n.k, kv_s.k) and torch.equal(kv_n.v, kv_s.v)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_drafted_row_attends_exactly_as_the_decode_step_it_saves(dtype):
    """Each of five drafted rows gives the bits a decode step of that token alone would: the
    verification forward attends as plain decoding does, so drafts cannot change a token."""
    prefix, ext = 23, 5
    b = make_paged_batch([(prefix, ext)], 9, 3, 64, dtype=dtype, page_size=4, seed=5)
    native = TorchReferenceBackend("native")
    kv = b.pool_copy()
    drafted = native.forward(b.q, b.k, b.v, kv, b.meta, b.scale)
    for j in range(ext):
        meta = AttentionMetadata(
            req_to_token=b.meta.req_to_token,
            req_rows=b.meta.req_rows,
            prefix_lens=[prefix + j],
            extend_lens=[1],
            positions=b.meta.positions[j : j + 1],
            out_slots=b.meta.out_slots[j : j + 1],
        )
        one = native.forward(b.q[j : j + 1], b.k[j : j + 1], b.v[j : j + 1], kv, meta, b.scale)
        assert torch.equal(one[0], drafted[j]), f"row {j}"


@pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 2, 3, 5, 8])
def test_the_native_head_kernel_on_both_sides_of_its_blocks(dtype, head_dim, group):
    """Head sizes 64 and 128 take the kernel's KV-head-at-a-time path (sixteen slots' scores at
    once; at 128 and group 8 the accumulators take two bands of columns): contexts of 1, 15, 16,
    17, 32 and 48 slots against the padded reference, in both pool dtypes."""
    spec = [(0, 1), (14, 1), (15, 1), (16, 1), (31, 1), (47, 1)]
    b = make_paged_batch(spec, 2 * group, 2, head_dim, dtype, page_size=4, seed=group)
    got, want = both_paths(b, "native")
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))
@pytest.mark.skipif(not cpu_ops.vector_512(), reason="the head kernel is AVX-512's")
@pytest.mark.parametrize(("dtype", "kv_dtype"), [(torch.float32,) * 2, (torch.bfloat16,) * 2])
def test_the_head_kernel_takes_every_shape_it_is_built_for_and_the_boot_says_so(dtype, kv_dtype):
    """The kernels above pass the reference either way; only the dispatch tells that head sizes
    64 and 128 at groups 1 to 8 take the KV-head-at-a-time path and other shapes do not."""
    backend = TorchReferenceBackend("native")
    for head_dim, group, by_head in (
        [(64, g, True) for g in range(1, 9)]
        + [(128, g, True) for g in range(1, 9)]
        + [(64, 9, False), (96, 2, False), (32, 1, False)]
    ):
        kernels = backend.kernels(HeadShape(3 * group, 3, head_dim, dtype, kv_dtype))
        way = "a KV head at a time" if by_head else "general loops"
        assert kernels["decode"] == f"native, {way}", (head_dim, group)
    assert backend.kernels(HeadShape(9, 3, 64, dtype, kv_dtype))["extend"] == "native"
    assert backend.kernels(HeadShape(9, 3, 96, dtype, kv_dtype))["extend"] == "sdpa"
    assert TorchReferenceBackend("grouped").kernels(HeadShape(9, 3, 64, dtype, kv_dtype)) == {
        "decode": "grouped",
        "extend": "sdpa",
    }


@pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_request_alone_or_in_a_batch_gets_the_same_bits(dtype):
    """Alone (fewer requests than threads) the kernel splits a request by KV heads; in a batch
    each request is one item. Either way each of its heads is computed alike, bit for bit."""
    spec = [(40, 1), (7, 1), (23, 1), (0, 1)]
    b = make_paged_batch(spec, 9, 3, 64, dtype, page_size=4, seed=3)
    native = TorchReferenceBackend("native")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        batch = native.forward(b.q, b.k, b.v, b.pool_copy(), b.meta, b.scale)
        for i, (prefix, _) in enumerate(spec):
            meta = AttentionMetadata(
                req_to_token=b.meta.req_to_token,
                req_rows=b.meta.req_rows[i : i + 1],
                prefix_lens=[prefix],
                extend_lens=[1],
                positions=b.meta.positions[i : i + 1],
                out_slots=b.meta.out_slots[i : i + 1],
            )
            one = native.forward(
                b.q[i : i + 1], b.k[i : i + 1], b.v[i : i + 1], b.pool_copy(), meta, b.scale
            )
            assert torch.equal(one[0], batch[i]), f"request {i}"
    finally:
        torch.set_num_threads(threads)
