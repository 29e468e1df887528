"""The grouped paged decode (kernels.paged_decode) against the padded SDPA decode it replaced, on
random page tables: GQA ratios 1 to 4, pages of 1 and 4 slots, ragged contexts (some of one
token), float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernels.paged_decode import IndexBuffers, build_plan, grouped_decode
from kernels.select import get_backend
from kernels.torch_ref import TorchReferenceBackend
from tests.unit.paged_batch import make_paged_batch

GQA = [(4, 4), (4, 2), (9, 3), (8, 2)]  # ratios 1, 2, 3 (the default model's), 4
# fp32: the two paths sum in different orders; one element in 2,560 differed by 3.5e-6 (GQA 8/2,
# head_dim 64), while the bugs this test caught (a dropped group mapping, an off-by-one mask,
# every query reading KV head 0) differ by more than 1e-2
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def both_paths(b) -> tuple[torch.Tensor, torch.Tensor]:
    """(grouped, padded) outputs of one decode batch, each from its own copy of the pool."""
    kv_g, kv_p = b.pool_copy(), b.pool_copy()
    got = TorchReferenceBackend().forward(b.q, b.k, b.v, kv_g, b.meta, b.scale)
    want = TorchReferenceBackend("padded").forward(b.q, b.k, b.v, kv_p, b.meta, b.scale)
    assert torch.equal(kv_g.k, kv_p.k) and torch.equal(kv_g.v, kv_p.v)  # the same writes
    return got, want


@settings(max_examples=60, deadline=None)
@given(
    gqa=st.sampled_from(GQA),
    page_size=st.sampled_from([1, 4]),
    lens=st.lists(st.integers(0, 40), min_size=2, max_size=9),
    head_dim=st.sampled_from([16, 64]),
    seed=st.integers(0, 2**16),
)
@example(gqa=(8, 2), page_size=1, lens=[18, 40, 15, 0, 40], head_dim=64, seed=37317)
def test_grouped_decode_equals_the_padded_reference(gqa, page_size, lens, head_dim, seed):
    heads, kv_heads = gqa
    b = make_paged_batch([(p, 1) for p in lens], heads, kv_heads, head_dim, torch.float32,
                         page_size, seed)  # fmt: skip
    got, want = both_paths(b)
    assert got.shape == want.shape == b.q.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize(("heads", "kv_heads"), GQA, ids=["mha", "gqa2", "gqa3", "gqa4"])
def test_bfloat16_pool_and_queries(heads, kv_heads, page_size):
    spec = [(17, 1), (0, 1), (33, 1), (5, 1)]
    b = make_paged_batch(spec, heads, kv_heads, 64, torch.bfloat16, page_size, seed=heads)
    got, want = both_paths(b)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), **TOL[torch.bfloat16])


def test_each_query_head_reads_its_own_kv_head():
    """Query head ``h`` uses KV head ``h // group``: changing KV head 1 of the pool moves the
    outputs of query heads 3..5 (group 3) and of no other head."""
    b = make_paged_batch([(20, 1), (7, 1)], 9, 3, 16, seed=5)
    kv = b.pool_copy()
    before = TorchReferenceBackend().forward(b.q, b.k, b.v, kv, b.meta, b.scale)
    kv.k[:, 1] *= -1.0
    after = TorchReferenceBackend().forward(b.q, b.k, b.v, kv, b.meta, b.scale)
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
    assert get_backend("torch").decode == "grouped"
    padded = get_backend("torch-padded")
    assert padded.decode == "padded" and padded.name == "torch-padded"
    with pytest.raises(ValueError, match="decode path 'fast'"):
        TorchReferenceBackend("fast")
