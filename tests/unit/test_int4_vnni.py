"""Fast mode's integer int4 products (``engine.model.int4_vnni``, ``kernels/cpu_int4.cpp``):
the kernel against the same arithmetic in torch, against the dequantised values' product, a
row's bits whatever rows share its product, and where the plan takes it."""

from __future__ import annotations

import pytest
import torch

from engine.model.int4_vnni import ROWS, int4_vnni_native, pack, quantise_activations, reference
from engine.model.quant import QuantWeight, plan_quant, quantize_int4
from kernels.cpu_ops import cpu_flags

VNNI_CPU = frozenset({"avx2", "avx512f", "avx512bw", "avx512dq", "avx512_bf16", "avx512_vnni"})
BF16_ONLY = frozenset({"avx2", "avx512f", "avx512bw", "avx512dq", "avx512_bf16"})
needs_kernel = pytest.mark.skipif(
    not int4_vnni_native(cpu_flags()),
    reason="no AVX-512 VNNI here, or the native ops are not built: the kernel does not run",
)


def _quantised(out: int, inp: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g) * torch.rand(out, 1, generator=g)
    return quantize_int4(w, 32)


def _rows(n: int, inp: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, inp, generator=g)
    return x * torch.logspace(-2, 2, n)[:, None]  # rows four decades apart


def _mm(x: torch.Tensor, q, scale, lo) -> torch.Tensor:
    packed, scales = pack(q, scale, lo)
    return torch.ops.attest.int4_vnni_mm(x, packed, scales)


@needs_kernel
@pytest.mark.parametrize(("out", "inp"), [(16, 32), (48, 64), (96, 96), (160, 576)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_the_kernel_computes_the_arithmetic_it_claims(out, inp, rows):
    """Every block, group and row where the layout puts it: 1 to 3 runs of four rows, block
    counts that do not fill a run of blocks (3, 6, 10), one group and eighteen."""
    q, scale, lo = _quantised(out, inp)
    x = _rows(rows, inp)
    got = _mm(x, q, scale, lo).double()
    want = reference(x, q, scale, lo)
    tol = 1e-5 * want.abs().amax(dim=1, keepdim=True) + 1e-30
    assert bool(((got - want).abs() <= tol).all()), (got - want).abs().amax(dim=1)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 4, 7])
def test_it_computes_the_dense_values_product_within_what_8_bits_cost(rows):
    """The reference is not wrong with the kernel: against the float product of the same int4
    values, each row within 2 % of its largest, a row a hundred times smaller than its
    neighbours as exact as they are."""
    q, scale, lo = _quantised(96, 256)
    dense = (q.float().reshape(96, 8, 32) * scale[..., None] + lo[..., None]).reshape(96, 256)
    x = _rows(rows, 256)
    got = _mm(x, q, scale, lo)
    want = x @ dense.to(torch.bfloat16).float().t()
    err = (got - want).abs().amax(dim=1)
    assert bool((err <= 0.02 * want.abs().amax(dim=1)).all()), err


@needs_kernel
def test_a_rows_result_is_the_same_bits_in_any_product():
    """The speculator and a prefix hit compute a row in other company than a plain step."""
    q, scale, lo = _quantised(64, 128)
    x = _rows(9, 128)
    whole = _mm(x, q, scale, lo)
    for i in range(9):
        assert torch.equal(_mm(x[i : i + 1], q, scale, lo)[0], whole[i]), i
    assert torch.equal(_mm(x[3:7], q, scale, lo), whole[3:7])


@needs_kernel
def test_bfloat16_rows_give_the_float_rows_result_rounded():
    q, scale, lo = _quantised(32, 64)
    x = _rows(3, 64).to(torch.bfloat16)
    got = _mm(x, q, scale, lo)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, _mm(x.float(), q, scale, lo).to(torch.bfloat16))


@needs_kernel
def test_a_row_of_zeros_gives_zeros():
    q, scale, lo = _quantised(32, 64)
    x = torch.zeros(2, 64)
    x[1, 5] = 1.0
    got = _mm(x, q, scale, lo)
    assert torch.equal(got[0], torch.zeros(32))
    assert got[1].abs().sum() > 0


@needs_kernel
def test_a_malformed_product_is_refused_with_the_reason():
    q, scale, lo = _quantised(32, 64)
    packed, scales = pack(q, scale, lo)
    with pytest.raises(RuntimeError, match="x has 96 columns, the matrix 64"):
        torch.ops.attest.int4_vnni_mm(torch.ones(1, 96), packed, scales)
    with pytest.raises(RuntimeError, match="scales"):
        torch.ops.attest.int4_vnni_mm(torch.ones(1, 64), packed, scales[:1])
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        torch.ops.attest.int4_vnni_mm(torch.ones(1, 64, dtype=torch.float64), packed, scales)
    with pytest.raises(ValueError, match="blocks of 16"):
        pack(q[:24], scale[:24], lo[:24])


def test_the_packing_keeps_every_value_where_the_kernel_reads_it():
    """Without the kernel: unpack the layout by its definition and get q back."""
    q, scale, lo = _quantised(32, 64)
    packed, scales = pack(q, scale, lo)
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


def test_the_plan_takes_it_for_int4_where_the_cpu_has_vnni(monkeypatch):
    plan = plan_quant("int4", "cpu", VNNI_CPU, native=True)
    assert (
        plan.int4_vnni == int4_vnni_native(VNNI_CPU)
        and plan.fields()["int4_vnni"] == plan.int4_vnni
    )
    assert not plan_quant("int4", "cpu", BF16_ONLY, native=True).int4_vnni
    assert not plan_quant("int8", "cpu", VNNI_CPU, native=True).int4_vnni
    assert not plan_quant("int4", "cpu", VNNI_CPU, native=False).int4_vnni
    monkeypatch.setenv("ATTEST_INT4_VNNI", "0")
    assert not plan_quant("int4", "cpu", VNNI_CPU, native=True).int4_vnni


@needs_kernel
def test_a_quantised_matrix_takes_it_for_its_few_row_products():
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(3))
    qw = QuantWeight(w, "int4", torch.bfloat16, 4, int4_vnni=True)
    x = _rows(4, 64).to(torch.bfloat16)
    packed, scales, _ = qw.packed_form()
    assert packed.dim() == 4
    assert torch.equal(qw.packed_matmul(x), torch.ops.attest.int4_vnni_mm(x, packed, scales))
    plain = QuantWeight(w, "int4", torch.bfloat16, 4)
    assert plain.packed_form()[0].dim() == 2  # torch's packing
    assert torch.equal(plain.dense, qw.dense)  # the same values
