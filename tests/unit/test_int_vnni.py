"""Fast mode's integer products for int4 and int8 matrices (``engine.model.int_vnni``,
``kernels/cpu_int.cpp``): each kernel against the same arithmetic in torch, against the
dequantised values' product, a row's bits whatever rows share its product, and where the plan
takes them."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from engine.model.int_vnni import (
    ROWS,
    int_vnni_native,
    pack_int4,
    pack_int8,
    quantise_activations,
    reference_int4,
    reference_int8,
    tiles_from,
)
from engine.model.quant import QuantWeight, plan_quant, quantize_int4, quantize_int8
from kernels.cpu_ops import cpu_flags

VNNI_CPU = frozenset({"avx2", "avx512f", "avx512bw", "avx512dq", "avx512_bf16", "avx512_vnni"})
BF16_ONLY = frozenset({"avx2", "avx512f", "avx512bw", "avx512dq", "avx512_bf16"})
needs_kernel = pytest.mark.skipif(
    not int_vnni_native(cpu_flags()),
    reason="no AVX-512 VNNI here, or the native ops are not built: the kernel does not run",
)

needs_tiles = pytest.mark.skipif(
    not int_vnni_native(cpu_flags()) or tiles_from() == 0,
    reason="no AMX int8 tiles here (or the native ops are built without them)",
)


@contextmanager
def _tiles_from(rows: int):
    """int8 products of at least ``rows`` rows on the tiles (0: none) for the block's length."""
    old = torch.ops.attest.set_int8_tiles_from(rows)
    try:
        yield
    finally:
        torch.ops.attest.set_int8_tiles_from(old)


class _Matrix:
    """A random matrix quantised to ``bits``: its kernel, the kernel's arithmetic in torch, and
    its dequantised values."""

    def __init__(self, bits: int, out: int, inp: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(out, inp, generator=g) * torch.rand(out, 1, generator=g)
        self.bits = bits
        if bits == 4:
            self.q, self.scale, self.lo = quantize_int4(w, 32)
            self.packed, self.scales = pack_int4(self.q, self.scale, self.lo)
            groups = self.q.float().reshape(out, inp // 32, 32) * self.scale[..., None]
            self.values = (groups + self.lo[..., None]).reshape(out, inp)
        else:
            self.q, self.scale = quantize_int8(w)
            self.packed, self.scales = pack_int8(self.q, self.scale)
            self.values = self.q.float() * self.scale[:, None]

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        op = torch.ops.attest.int4_vnni_mm if self.bits == 4 else torch.ops.attest.int8_vnni_mm
        return op(x, self.packed, self.scales)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        if self.bits == 4:
            return reference_int4(x, self.q, self.scale, self.lo)
        return reference_int8(x, self.q, self.scale)


def _rows(n: int, inp: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, inp, generator=g)
    return x * torch.logspace(-2, 2, n)[:, None]  # rows four decades apart


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("out", "inp"), [(16, 32), (48, 64), (96, 96), (160, 576), (656, 64)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_the_kernel_computes_the_arithmetic_it_claims(bits, out, inp, rows):
    """Every block, group and row where the layout puts it: 1 to 3 runs of four rows, block
    counts that do not fill a run of blocks (3, 6, 10), one group and eighteen, and 41 blocks:
    each thread's share many runs of blocks, with one left over."""
    m = _Matrix(bits, out, inp)
    x = _rows(rows, inp)
    got = m.mm(x).double()
    want = m.reference(x)
    tol = 1e-5 * want.abs().amax(dim=1, keepdim=True) + 1e-30
    assert bool(((got - want).abs() <= tol).all()), (got - want).abs().amax(dim=1)


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 4, 7])
def test_it_computes_the_dense_values_product_within_what_8_bits_cost(bits, rows):
    """The reference is not wrong with the kernel: against the float product of the same
    quantised values, each row within 2 % of its largest, a row a hundred times smaller than
    its neighbours as exact as they are."""
    m = _Matrix(bits, 96, 256)
    x = _rows(rows, 256)
    got = m.mm(x)
    want = x @ m.values.t()
    err = (got - want).abs().amax(dim=1)
    assert bool((err <= 0.02 * want.abs().amax(dim=1)).all()), err


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_a_rows_result_is_the_same_bits_in_any_product(bits):
    """The speculator and a prefix hit compute a row in other company than a plain step."""
    m = _Matrix(bits, 64, 128)
    x = _rows(9, 128)
    whole = m.mm(x)
    for i in range(9):
        assert torch.equal(m.mm(x[i : i + 1])[0], whole[i]), i
    assert torch.equal(m.mm(x[3:7]), whole[3:7])


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_bfloat16_rows_give_the_float_rows_result_rounded(bits):
    m = _Matrix(bits, 32, 64)
    x = _rows(3, 64).to(torch.bfloat16)
    got = m.mm(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, m.mm(x.float()).to(torch.bfloat16))


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_a_row_of_zeros_gives_zeros(bits):
    m = _Matrix(bits, 32, 64)
    x = torch.zeros(2, 64)
    x[1, 5] = 1.0
    got = m.mm(x)
    assert torch.equal(got[0], torch.zeros(32))
    assert got[1].abs().sum() > 0


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("col", [40, 57])  # in the first and in the second half of a group
def test_a_row_with_a_nan_or_an_infinity_comes_out_nan_and_alone(bits, bad, col):
    """As the float product would not be finite: a broken activation is not quantised into a
    plausible number, and it does not leak into the other rows."""
    m = _Matrix(bits, 32, 64)
    x = _rows(3, 64)
    x[1, col] = bad
    got = m.mm(x)
    assert bool(got[1].isnan().all())
    assert torch.equal(got[[0, 2]], m.mm(x[[0, 2]]))


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_an_empty_product_is_empty(bits):
    m = _Matrix(bits, 32, 64)
    assert m.mm(torch.zeros(0, 64)).shape == (0, 32)


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_a_malformed_product_is_refused_with_the_reason(bits):
    m = _Matrix(bits, 32, 64)
    op = torch.ops.attest.int4_vnni_mm if bits == 4 else torch.ops.attest.int8_vnni_mm
    with pytest.raises(RuntimeError, match="x has 96 columns, the matrix 64"):
        op(torch.ones(1, 96), m.packed, m.scales)
    with pytest.raises(RuntimeError, match="scales"):
        op(torch.ones(1, 64), m.packed, m.scales[:1])
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        op(torch.ones(1, 64, dtype=torch.float64), m.packed, m.scales)
    other = _Matrix(12 - bits, 32, 64)  # the other layout
    with pytest.raises(RuntimeError, match="packed"):
        op(torch.ones(1, 64), other.packed, other.scales)
    with pytest.raises(ValueError, match="blocks of 16"):
        pack_int4(m.q[:24], m.scale[:24], m.scale[:24])
    with pytest.raises(ValueError, match="groups of 32"):
        pack_int8(m.q[:, :48], m.scale)


def test_the_int8_packing_keeps_every_value_where_the_kernel_reads_it():
    """Without the kernel: read the layout by its definition and get q, 128 * its group sums
    and its scales back."""
    m = _Matrix(8, 32, 64)
    back = torch.empty(32, 64, dtype=torch.long)
    for b in range(2):
        for r in range(ROWS):
            for gi in range(2):
                for j in range(8):
                    cols = gi * 32 + 4 * j
                    back[b * ROWS + r, cols : cols + 4] = m.packed[b, gi, j, 4 * r : 4 * r + 4]
    assert torch.equal(back, m.q.long())
    assert m.scales[1, 0, 5].item() == 128 * m.q[ROWS + 5, :32].long().sum().item()
    assert m.scales[0, 2, 9].item() == m.scale[9].item()


def test_the_int4_packing_keeps_every_value_where_the_kernel_reads_it():
    """Without the kernel: unpack the layout by its definition and get q back."""
    m = _Matrix(4, 32, 64)
    q, scale, lo, packed, scales = m.q, m.scale, m.lo, m.packed, m.scales
    n, k, g = 32, 64, 2
    low, high = (packed & 15).long(), (packed >> 4).long()  # [block, group, j, row * 4 + byte]
    back = torch.empty(n, k, dtype=torch.long)
    for b in range(n // ROWS):
        for r in range(ROWS):
            for gi in range(g):
                for j in range(4):
                    cols = gi * 32 + 8 * j
                    back[b * ROWS + r, cols : cols + 4] = low[b, gi, j, 4 * r : 4 * r + 4]
                    back[b * ROWS + r, cols + 4 : cols + 8] = high[b, gi, j, 4 * r : 4 * r + 4]
    assert torch.equal(back, q.long())
    assert torch.equal(scales[1, 1, 0, 3].float(), scale[ROWS + 3, 1].to(torch.bfloat16).float())
    assert torch.equal(scales[0, 0, 1, 7].float(), lo[7, 0].to(torch.bfloat16).float())


def test_the_activations_are_quantised_per_group_of_32():
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1], x[0, 40] = 2.0, -1.0, 0.5
    a, d = quantise_activations(x)
    assert a[0, 0] == 127 and a[0, 1] == -64 and a[0, 40] == 127  # -63.5 to even
    assert torch.allclose(d[0], torch.tensor([2.0 / 127, 0.5 / 127], dtype=torch.float64))


@needs_tiles
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("out", "inp"), [(16, 32), (48, 96), (160, 576), (64, 1536)])
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 40])
def test_the_tiles_give_the_vector_kernels_bits(dtype, out, inp, rows):
    """A row's bits do not depend on which kernel ran it (odd and even counts of groups, a
    partial tile of rows, a row of zeros and one with a NaN among them)."""
    m = _Matrix(8, out, inp)
    x = _rows(rows, inp).to(dtype)
    x[rows // 2, inp // 3] = float("nan")
    if rows > 2:
        x[1] = 0
    with _tiles_from(0):
        vector = m.mm(x)
    with _tiles_from(1):
        tiles = m.mm(x)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(tiles.view(bits), vector.view(bits))
    nan_row = rows // 2
    assert tiles[nan_row].isnan().all()
    assert not tiles[torch.arange(rows) != nan_row].isnan().any()


@needs_tiles
def test_the_tiles_bound_is_refused_below_zero_and_off_by_the_environment():
    with pytest.raises(RuntimeError, match="0 or more"):
        torch.ops.attest.set_int8_tiles_from(-1)
    root = Path(__file__).resolve().parents[2]
    code = "from engine.model.int_vnni import tiles_from; print(tiles_from())"
    env = {**os.environ, "ATTEST_INT_TILES": "0"}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "0"


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_the_plan_takes_them_where_the_cpu_has_vnni(monkeypatch, mode):
    plan = plan_quant(mode, "cpu", VNNI_CPU, native=True)
    assert plan.int_vnni == int_vnni_native(VNNI_CPU) and plan.fields()["int_vnni"] == plan.int_vnni
    # the boot receipt says where int8 products run on AMX's tiles
    tiles = f"AMX int8 tiles from {tiles_from()} rows"
    assert (tiles in plan.kernel) == (mode == "int8" and plan.int_vnni and tiles_from() > 0)
    assert not plan_quant(mode, "cpu", BF16_ONLY, native=True).int_vnni
    assert not plan_quant(mode, "cpu", VNNI_CPU, native=False).int_vnni
    monkeypatch.setenv("ATTEST_INT_VNNI", "0")
    assert not plan_quant(mode, "cpu", VNNI_CPU, native=True).int_vnni


@needs_kernel
@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_a_quantised_matrix_takes_them_for_its_few_row_products(mode):
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(3))
    qw = QuantWeight(w, mode, torch.bfloat16, 4, int_vnni=True)
    x = _rows(4, 64).to(torch.bfloat16)
    packed, scales, _ = qw.packed_form()
    assert packed.dim() == 4
    op = torch.ops.attest.int4_vnni_mm if mode == "int4" else torch.ops.attest.int8_vnni_mm
    assert torch.equal(qw.packed_matmul(x), op(x, packed, scales))
    plain = QuantWeight(w, mode, torch.bfloat16, 4)
    assert plain.packed_form()[0].dim() == 2  # torch's packing
    assert torch.equal(plain.dense, qw.dense)  # the same values


@needs_kernel
def test_an_int8_matrix_of_rows_not_in_blocks_of_16_keeps_torchs_kernel():
    w = torch.randn(40, 64, generator=torch.Generator().manual_seed(4))
    qw = QuantWeight(w, "int8", torch.bfloat16, 4, int_vnni=True)
    assert qw.packed_form()[0].dim() == 2
