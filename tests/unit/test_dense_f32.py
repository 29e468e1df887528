"""The native float32 product on AVX-512 (kernels/cpu_dense_f32.cpp), which a float32 matrix
laid out at load takes where the native ops are built (engine.model.orient.pack): against the
product in float64 and exactly where the sums are whole numbers, a row's bits the same in any
batch, rows on both sides of its steps of 12, strided rows, and the shapes it refuses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model import orient
from engine.model.orient import dense_f32, on_f32, on_tiles, pack, packed_linear

pytestmark = pytest.mark.skipif(not dense_f32(), reason="the native ops are not built with AVX-512")


def _f32(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 60),
    n=st.sampled_from([32, 64, 96, 160]),
    k=st.sampled_from([1, 7, 32, 100, 576]),
    wide=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_the_f32_product_is_the_float64_product_within_float32s_sums(m, n, k, wide, seed):
    w = _f32(n, k, seed=seed)
    x = _f32(m, k + 5 * wide, seed=seed + 1)[:, :k]  # rows strided when wide
    packed = pack(w)
    assert packed is not None and on_f32(packed) and not on_tiles(packed)
    got = packed_linear(x, packed)
    assert got.shape == (m, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), x.double() @ w.double().t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m", [1, 11, 12, 13, 24, 25, 64, 130])
def test_whole_number_sums_are_exact_in_every_row_and_column(m):
    """Small whole numbers: every partial sum is exact in float32, so any entry out of place
    (a row, a column, a block, the rows past a step of 12) shows as a wrong number."""
    g = torch.Generator().manual_seed(m)
    w = torch.randint(-4, 5, (96, 300), generator=g).float()
    x = torch.randint(-4, 5, (m, 300), generator=g).float()
    got = torch.ops.attest.f32_linear(x, torch.ops.attest.f32_pack(w))
    assert torch.equal(got, (x.double() @ w.double().t()).float())


def test_a_rows_bits_do_not_depend_on_its_batch():
    """Each sum runs over K in order from zero whichever rows share its step: a row alone, or
    at any place in any batch, gets the same bits."""
    w, x = _f32(64, 576, seed=1), _f32(40, 576, seed=2)
    packed = torch.ops.attest.f32_pack(w)
    whole = torch.ops.attest.f32_linear(x, packed)
    for n in (1, 5, 12, 13, 24, 39):
        assert torch.equal(torch.ops.attest.f32_linear(x[:n], packed), whole[:n])
    for r in (0, 11, 12, 39):
        assert torch.equal(torch.ops.attest.f32_linear(x[r : r + 1], packed), whole[r : r + 1])


def test_a_shape_it_does_not_take_is_laid_out_for_onednn_and_a_wrong_one_refused():
    w = _f32(48, 64, seed=4)  # 48 rows: not whole blocks of 32 columns
    assert not torch.ops.attest.f32_shape(48, 64)
    packed = pack(w)
    assert packed is not None and not on_f32(packed)
    with pytest.raises(RuntimeError, match="N must be a multiple of 32"):
        torch.ops.attest.f32_pack(w)
    ours = torch.ops.attest.f32_pack(_f32(64, 64, seed=5))
    assert ours.shape == (2, 64, 32)
    with pytest.raises(RuntimeError, match="x has 96 columns, the weights 64"):
        torch.ops.attest.f32_linear(_f32(3, 96, seed=6), ours)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.attest.f32_linear(_f32(3, 64, seed=6).bfloat16(), ours)


def test_the_switch_keeps_onednns_layout(monkeypatch):
    monkeypatch.setenv("ATTEST_DENSE_F32", "0")
    orient.dense_f32.cache_clear()
    try:
        packed = pack(_f32(64, 64, seed=7))
        assert packed is not None and not on_f32(packed)
    finally:
        monkeypatch.delenv("ATTEST_DENSE_F32")
        orient.dense_f32.cache_clear()
    assert on_f32(pack(_f32(64, 64, seed=7)))
