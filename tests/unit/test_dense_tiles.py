"""The native bfloat16 product on AMX's tiles (kernels/cpu_dense.cpp), which a bfloat16 matrix
laid out at load takes where the CPU has the tiles (engine.model.orient.pack): against the
product in float64, rows on both sides of its blocks of 32 and 16 (a tile's), strided rows,
and the shapes it refuses; a gate/up matrix laid out gated, whose product is the MLP's
activation itself."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.fused import native_silu_mul
from engine.model.orient import dense_tiles, gated_linear, on_tiles, pack, packed_linear

pytestmark = pytest.mark.skipif(not dense_tiles(), reason="no AMX bfloat16 tiles here")


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 100),
    n=st.sampled_from([32, 64, 96, 160]),
    k=st.sampled_from([32, 64, 96, 192]),
    wide=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_the_tiles_product_is_the_float64_product_rounded_once(m, n, k, wide, seed):
    """Each entry a float32 sum rounded once to bfloat16: within half a bfloat16 step (and the
    float32 sum's own error) of the float64 product, rows read at their stride."""
    w = _bf16(n, k, seed=seed)
    x = _bf16(m, k + 32 * wide, seed=seed + 1)[:, :k]  # rows strided when wide
    packed = pack(w)
    assert packed is not None and on_tiles(packed)
    got = packed_linear(x, packed)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    ref = x.double() @ w.double().t()
    torch.testing.assert_close(got.double(), ref, rtol=2**-8, atol=1e-4)


@pytest.mark.parametrize("m", [1, 16, 17, 32, 33, 48, 64, 65, 128])
def test_each_of_the_kernels_ways_is_the_float64_product_rounded_once(m):
    """Every way the kernel runs rows: one pass of 32 rows or fewer (the rows' tiles kept in
    L1), two passes (the rows' tiles loaded as a stream), and runs of blocks past 64 rows (the
    weights' tiles as a stream); K long enough that a block's tiles outgrow L1."""
    w = _bf16(96, 1536, seed=m)
    x = _bf16(m, 1536, seed=m + 1)
    got = packed_linear(x, pack(w))
    torch.testing.assert_close(got.double(), x.double() @ w.double().t(), rtol=2**-8, atol=1e-3)


def test_the_layout_is_the_weights_own_bytes():
    """Every weight once, none lost: the layout's entries are the weight's entries."""
    w = _bf16(96, 64, seed=3)
    packed = pack(w)
    assert packed.shape == (3, 2, 2, 16, 32)
    assert torch.equal(packed.flatten().sort().values, w.flatten().sort().values)


def test_a_shape_the_tiles_do_not_take_is_laid_out_for_onednn_and_a_wrong_one_refused():
    w = _bf16(48, 64, seed=4)  # 48 rows: not whole blocks of 32 columns
    assert not torch.ops.attest.tile_shape(48, 64)
    packed = pack(w)
    assert packed is not None and not on_tiles(packed)
    with pytest.raises(RuntimeError, match="multiples of 32"):
        torch.ops.attest.tile_pack(w)
    tiles = pack(_bf16(64, 64, seed=5))
    with pytest.raises(RuntimeError, match="x has 96 columns, the weights 64"):
        torch.ops.attest.tile_linear(_bf16(3, 96, seed=6), tiles)
    with pytest.raises(RuntimeError, match="bfloat16"):
        torch.ops.attest.tile_linear(torch.randn(3, 64), tiles)


@settings(max_examples=40, deadline=None)
@given(
    m=st.sampled_from([1, 5, 16, 17, 32, 33, 64, 65, 100]),
    n=st.sampled_from([16, 48, 64, 80, 192]),
    k=st.sampled_from([32, 96, 576]),
    wide=st.integers(0, 1),
    seed=st.integers(0, 2**16),
)
def test_a_gated_product_is_silu_mul_of_the_product_bit_for_bit(m, n, k, wide, seed):
    """silu(gate) * up as the sums leave the tiles: the same bits as ``silu_mul`` of the plain
    product, for every row count the kernel's ways take, columns in silu_mul's vector loop
    (below the last whole 64 of n) and past it in its scalar loop (n = 16, 48, 80), rows at
    their stride."""
    w = _bf16(2 * n, k, seed=seed) * 0.25
    x = _bf16(m, k + 32 * wide, seed=seed + 1)[:, :k]
    gated = pack(w, gated=True)
    assert on_tiles(gated)
    got = gated_linear(x, gated, native_silu_mul)
    ref = native_silu_mul(packed_linear(x, pack(w)))
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


def test_a_gated_layout_pairs_each_block_of_gate_with_the_same_block_of_up():
    """Block b of the gated layout holds gate's columns 16b .. 16b + 15, then up's: its plain
    product gives those columns in that order."""
    n, k = 64, 64
    w = _bf16(2 * n, k, seed=7)
    x = _bf16(3, k, seed=8)
    plain = packed_linear(x, pack(w))
    interleaved = packed_linear(x, pack(w, gated=True))
    order = torch.arange(2 * n).view(2, n // 16, 16).transpose(0, 1).reshape(-1)
    assert torch.equal(interleaved, plain[:, order])
    with pytest.raises(RuntimeError, match="x has 96 columns, the weights 64"):
        torch.ops.attest.tile_gated_linear(_bf16(3, 96, seed=9), pack(w, gated=True))


@pytest.mark.parametrize("m", [1, 5, 16, 33, 64, 100])
def test_a_widened_product_is_the_bfloat16_product_in_float32(m):
    """Widened (the LM head's logits), each sum is rounded to bfloat16 as always and stored as
    float32: bit for bit ``.float()`` of the bfloat16 product."""
    w = _bf16(96, 576, seed=m)
    x = _bf16(m, 576, seed=m + 1)
    packed = pack(w)
    got = packed_linear(x, packed, widen=True)
    assert got.dtype == torch.float32 and got.shape == (m, 96)
    assert torch.equal(got.view(torch.int32), packed_linear(x, packed).float().view(torch.int32))
