"""The native dense products on AVX-512 vectors (kernels/cpu_dense_vec.cpp), which a matrix laid
out at load takes where the native ops are built (engine.model.orient.pack): float32's by fused
multiply-adds, and bfloat16's by AVX-512 BF16 pair products where the CPU has no AMX tiles.
Against the product in float64 and exactly where the sums are whole numbers, a row's bits the
same in any batch, rows on both sides of its steps of 12, strided rows, bfloat16's sums widened
to float32, a gate/up matrix's gated product bit for bit silu_mul of the plain one, and the
shapes they refuse."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model import orient
from engine.model.fused import native_silu_mul
from engine.model.orient import (
    dense_f32,
    dense_pairs,
    dense_tiles,
    gated_linear,
    on_f32,
    on_pairs,
    on_tiles,
    pack,
    packed_linear,
)


@dataclass(frozen=True)
class Way:
    """One of the two products: its dtype, its switch and what lays a weight out for it."""

    dtype: torch.dtype
    built: Callable[[], bool]
    switch: str  # the environment's off switch
    ours: Callable[[torch.Tensor], bool]  # whether a packed copy is laid out for it
    pack: str  # attest::<pack>, attest::<linear>, attest::<shape>
    linear: str
    shape: str
    tol: dict  # against float64: float32's sums, or bfloat16's rounding of them

    def packed(self, w: torch.Tensor) -> torch.Tensor:
        return getattr(torch.ops.attest, self.pack)(w)

    def packed_gated(self, w: torch.Tensor) -> torch.Tensor:
        return getattr(torch.ops.attest, self.pack)(w, gated=True)

    def product(self, x: torch.Tensor, packed: torch.Tensor, **kw) -> torch.Tensor:
        return getattr(torch.ops.attest, self.linear)(x, packed, **kw)


F32 = Way(
    torch.float32,
    dense_f32,
    "ATTEST_DENSE_F32",
    on_f32,
    "f32_pack",
    "f32_linear",
    "f32_shape",
    {"rtol": 1e-5, "atol": 1e-4},
)
PAIRS = Way(
    torch.bfloat16,
    dense_pairs,
    "ATTEST_DENSE_PAIRS",
    on_pairs,
    "pairs_pack",
    "pairs_linear",
    "pairs_shape",
    {"rtol": 1e-2, "atol": 2e-2},
)
WAYS = [
    pytest.param(
        F32,
        id="float32",
        marks=pytest.mark.skipif(
            not dense_f32(), reason="the native ops are not built with AVX-512"
        ),
    ),
    pytest.param(
        PAIRS,
        id="bfloat16",
        marks=pytest.mark.skipif(
            not dense_pairs(), reason="the native ops are not built with AVX-512 BF16"
        ),
    ),
]


def _packs_for(way: Way) -> bool:
    """Whether ``orient.pack`` lays ``way``'s dtype out for it: not bfloat16 on a CPU with AMX's
    tiles, whose product takes bfloat16 there (the pairs product runs there all the same,
    through its own pack)."""
    return not (way is PAIRS and dense_tiles())


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("way", WAYS)
@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 60),
    n=st.sampled_from([32, 64, 96, 160]),
    k=st.sampled_from([2, 8, 32, 100, 576]),
    wide=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_the_product_is_the_float64_product_within_its_sums(way, m, n, k, wide, seed):
    w = _randn(n, k, seed=seed, dtype=way.dtype)
    x = _randn(m, k + 6 * wide, seed=seed + 1, dtype=way.dtype)[:, :k]  # rows strided when wide
    packed = pack(w) if _packs_for(way) else way.packed(w)
    assert packed is not None and way.ours(packed) and not on_tiles(packed)
    got = packed_linear(x, packed)
    assert got.shape == (m, n) and got.dtype == way.dtype
    torch.testing.assert_close(got.double(), x.double() @ w.double().t(), **way.tol)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("m", [1, 11, 12, 13, 24, 25, 64, 130])
def test_whole_number_sums_are_exact_in_every_row_and_column(way, m):
    """Small whole numbers: every partial sum is exact in float32 (and each sum, rounded once to
    bfloat16, is the exact sum's rounding), so any entry out of place (a row, a column, a
    block, a pair, the rows past a step of 12) shows as a wrong number."""
    g = torch.Generator().manual_seed(m)
    w = torch.randint(-4, 5, (96, 300), generator=g).to(way.dtype)
    x = torch.randint(-4, 5, (m, 300), generator=g).to(way.dtype)
    got = way.product(x, way.packed(w))
    assert torch.equal(got, (x.double() @ w.double().t()).float().to(way.dtype))


@pytest.mark.parametrize("way", WAYS)
def test_a_rows_bits_do_not_depend_on_its_batch(way):
    """Each sum runs over K in order from zero whichever rows share its step: a row alone, or
    at any place in any batch, gets the same bits."""
    w, x = _randn(64, 576, seed=1, dtype=way.dtype), _randn(40, 576, seed=2, dtype=way.dtype)
    packed = way.packed(w)
    whole = way.product(x, packed)
    for n in (1, 5, 12, 13, 24, 39):
        assert torch.equal(way.product(x[:n], packed), whole[:n])
    for r in (0, 11, 12, 39):
        assert torch.equal(way.product(x[r : r + 1], packed), whole[r : r + 1])


@pytest.mark.parametrize("m", [1, 7, 12, 13, 64])
@pytest.mark.parametrize("way", WAYS[1:])
def test_widened_bfloat16_sums_are_the_bfloat16_product_in_float32(way, m):
    w, x = _randn(96, 576, seed=m, dtype=way.dtype), _randn(m, 576, seed=m + 1, dtype=way.dtype)
    packed = way.packed(w)
    wide = packed_linear(x, packed, widen=True)
    assert wide.dtype == torch.float32
    assert torch.equal(wide, way.product(x, packed).float())


@pytest.mark.parametrize("way", WAYS)
def test_a_shape_it_does_not_take_is_laid_out_for_onednn_and_a_wrong_one_refused(way):
    w = _randn(48, 64, seed=4, dtype=way.dtype)  # 48 rows: not whole blocks of 32 columns
    assert not getattr(torch.ops.attest, way.shape)(48, 64)
    if _packs_for(way):
        packed = pack(w)
        assert packed is not None and not way.ours(packed)
    with pytest.raises(RuntimeError, match="N must be a multiple of 32"):
        way.packed(w)
    ours = way.packed(_randn(64, 64, seed=5, dtype=way.dtype))
    assert ours.shape == ((2, 64, 32) if way is F32 else (2, 32, 32, 2))
    with pytest.raises(RuntimeError, match="x has 96 columns, the weights 64"):
        way.product(_randn(3, 96, seed=6, dtype=way.dtype), ours)
    other = torch.bfloat16 if way is F32 else torch.float32
    with pytest.raises(RuntimeError, match="float32" if way is F32 else "bfloat16"):
        way.product(_randn(3, 64, seed=6, dtype=other), ours)
    if way is PAIRS:  # an odd number of columns has no last pair
        assert not torch.ops.attest.pairs_shape(64, 63)
        with pytest.raises(RuntimeError, match="K even"):
            way.packed(_randn(64, 63, seed=7, dtype=way.dtype))


@pytest.mark.parametrize("way", WAYS)
def test_the_switch_keeps_onednns_layout(way, monkeypatch):
    if not _packs_for(way):
        pytest.skip("AMX's tiles take bfloat16 matrices here")
    cached = orient.dense_f32 if way is F32 else orient.dense_pairs
    monkeypatch.setenv(way.switch, "0")
    cached.cache_clear()
    try:
        packed = pack(_randn(64, 64, seed=7, dtype=way.dtype))
        assert packed is not None and not way.ours(packed)
    finally:
        monkeypatch.delenv(way.switch)
        cached.cache_clear()
    assert way.ours(pack(_randn(64, 64, seed=7, dtype=way.dtype)))


@pytest.mark.skipif(not dense_pairs(), reason="the native ops are not built with AVX-512 BF16")
@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 40),
    n=st.sampled_from([16, 48, 64, 80, 192]),
    k=st.sampled_from([2, 64, 100, 576]),
    wide=st.integers(0, 1),
    seed=st.integers(0, 2**16),
)
def test_a_gated_product_is_silu_mul_of_the_product_bit_for_bit(m, n, k, wide, seed):
    """silu(gate) * up as the sums leave the registers: the same bits as ``silu_mul`` of the
    plain product, columns in silu_mul's vector loop (below the last whole 64 of n) and past it
    in its scalar loop (n = 16, 48, 80), rows at their stride."""
    w = _randn(2 * n, k, seed=seed, dtype=torch.bfloat16) * 0.25
    x = _randn(m, k + 32 * wide, seed=seed + 1, dtype=torch.bfloat16)[:, :k]
    got = torch.ops.attest.pairs_gated_linear(x, PAIRS.packed_gated(w))
    ref = native_silu_mul(PAIRS.product(x, PAIRS.packed(w)))
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


@pytest.mark.skipif(not dense_pairs(), reason="the native ops are not built with AVX-512 BF16")
def test_a_gated_layout_pairs_each_block_of_gate_with_the_same_block_of_up():
    """Block b of the gated layout holds gate's columns 16b .. 16b + 15, then up's: its plain
    product gives those columns in that order; where orient.pack lays bfloat16 out for it, a
    gated pack's product through ``gated_linear`` is the gated one."""
    n, k = 64, 64
    w = _randn(2 * n, k, seed=7, dtype=torch.bfloat16)
    x = _randn(3, k, seed=8, dtype=torch.bfloat16)
    plain = PAIRS.product(x, PAIRS.packed(w))
    interleaved = PAIRS.product(x, PAIRS.packed_gated(w))
    order = torch.arange(2 * n).view(2, n // 16, 16).transpose(0, 1).reshape(-1)
    assert torch.equal(interleaved, plain[:, order])
    with pytest.raises(RuntimeError, match="x has 96 columns, the weights 64"):
        torch.ops.attest.pairs_gated_linear(
            _randn(3, 96, seed=9, dtype=torch.bfloat16), PAIRS.packed_gated(w)
        )
    if _packs_for(PAIRS):
        gated = pack(w, gated=True)
        assert on_pairs(gated)
        assert torch.equal(gated_linear(x, gated, native_silu_mul), native_silu_mul(plain))
