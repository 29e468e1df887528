"""Fast mode's integer products (``engine.model.vnni``): FBGEMM's int8 product with activations
quantised per row, against the dequantised values' float product, and the same bits for a row
whatever rows share its product."""

from __future__ import annotations

import pytest
import torch

from engine.model.int_vnni import int_vnni_native, tiles_from
from engine.model.llama import linear
from engine.model.quant import (
    REFINE_TOP,
    VNNI_MIN_WEIGHTS,
    VNNI_ROWS,
    QuantWeight,
    plan_quant,
    quantize_int8,
)
from engine.model.vnni import Int8Vnni, vnni_native
from kernels.cpu_ops import cpu_flags

VNNI_CPU = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
BF16_ONLY = frozenset({"avx2", "avx512f", "avx512_bf16"})
needs_vnni = pytest.mark.skipif(
    not vnni_native(cpu_flags()),
    reason="this CPU has no integer dot products (VNNI) or torch has no FBGEMM: not used here",
)


def _matrix(out: int = 96, inp: int = 128, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g)
    return w * torch.rand(out, 1, generator=g) * 3  # rows of unlike scales: a scale per row counts


def _rows(n: int, inp: int = 128, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, inp, generator=g)
    return x * torch.logspace(-2, 2, n)[:, None]  # rows four decades apart


@needs_vnni
@pytest.mark.parametrize("rows", [1, 2, 5, 64])
def test_the_integer_product_computes_the_dense_values_product(rows):
    """Within what 8-bit activations cost: each row quantised by its own range, so a row a
    hundred times smaller than its neighbours is as exact as they are."""
    w = _matrix()
    q, scale = quantize_int8(w)
    dense = q.float() * scale[:, None]
    x = _rows(rows)
    got = Int8Vnni(q, scale).matmul(x)
    ref = x @ dense.t()
    err = (got - ref).abs().amax(dim=1)
    assert bool((err <= 0.02 * ref.abs().amax(dim=1)).all()), (rows, err)


@needs_vnni
def test_a_rows_result_is_the_same_bits_in_any_product():
    """The speculator and a prefix hit compute a row in other company than a plain step: the
    product must not round a row by its neighbours' range."""
    w = _matrix(160, 192)
    q, scale = quantize_int8(w)
    op = Int8Vnni(q, scale)
    x = _rows(37, 192)
    alone = torch.cat([op.matmul(x[i : i + 1]) for i in range(len(x))])
    together = op.matmul(x)
    shuffled = op.matmul(x.flip(0)).flip(0)
    assert torch.equal(alone, together) and torch.equal(alone, shuffled)
    assert op.matmul(torch.zeros(2, 192)).abs().max() == 0


@needs_vnni
def test_the_product_of_bfloat16_rows_is_float32_as_the_logits_are_kept():
    w = _matrix()
    q, scale = quantize_int8(w)
    x = _rows(3).bfloat16()
    got = Int8Vnni(q, scale).matmul(x)
    assert got.dtype == torch.float32 and got.shape == (3, 96)


@pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines, reason="torch has no FBGEMM here"
)
def test_a_vnni_cpu_plans_int8_products_in_integers_and_others_do_not(monkeypatch):
    monkeypatch.delenv("ATTEST_VNNI", raising=False)
    plan = plan_quant("int4", "cpu", VNNI_CPU, native=True)
    assert plan.vnni_rows == VNNI_ROWS and "VNNI" in plan.path
    assert plan.fields()["vnni_rows"] == VNNI_ROWS
    other = plan_quant("int4", "cpu", BF16_ONLY, native=True)
    assert other.vnni_rows == 0 and "VNNI" not in other.path


@needs_vnni
def test_linear_takes_the_integer_product_up_to_its_rows_and_the_dense_values_beyond(
    monkeypatch,
):
    qw = QuantWeight(_matrix(4096, 1024), "int8", torch.bfloat16, 4, VNNI_ROWS)
    assert 4096 * 1024 >= VNNI_MIN_WEIGHTS
    assert qw.small_rows == VNNI_ROWS and qw.packed_bytes > 0
    calls = []
    real = Int8Vnni.matmul
    monkeypatch.setattr(Int8Vnni, "matmul", lambda self, x: calls.append(len(x)) or real(self, x))
    for rows in (1, 4, VNNI_ROWS, VNNI_ROWS + 1):
        out = linear(torch.randn(rows, 1024).bfloat16(), qw)
        assert out.shape == (rows, 4096)
    assert calls == [1, 4, VNNI_ROWS]


def test_int4_matrices_keep_their_own_kernel_on_a_vnni_cpu():
    qw = QuantWeight(_matrix(32, 64), "int4", torch.bfloat16, 4, VNNI_ROWS)
    assert qw.mode == "int4" and qw.small_rows == 4


def test_small_int8_matrices_keep_the_packed_kernel_on_a_vnni_cpu():
    """Below VNNI_MIN_WEIGHTS the product's fixed cost outweighs what it saves."""
    qw = QuantWeight(_matrix(64, 64), "int8", torch.bfloat16, 4, VNNI_ROWS)
    assert qw.small_rows == 4 and not isinstance(qw._packed, Int8Vnni)


def test_attest_vnni_0_turns_the_integer_products_off(monkeypatch):
    monkeypatch.setenv("ATTEST_VNNI", "0")
    assert not vnni_native(VNNI_CPU)
    assert plan_quant("int8", "cpu", VNNI_CPU, native=True).vnni_rows == 0


def _head(w: torch.Tensor, kernel: str) -> QuantWeight:
    """A matrix the size of an LM head, its few-row products FBGEMM's or the native ones."""
    if kernel == "native" and not (int_vnni_native(cpu_flags()) and tiles_from()):
        pytest.skip("the native integer products take the head only where AMX tiles are")
    qw = QuantWeight(w, "int8", torch.bfloat16, 4, VNNI_ROWS, int_vnni=kernel == "native")
    assert isinstance(qw._packed, Int8Vnni) == (kernel == "fbgemm") and qw.refined
    return qw


@needs_vnni
@pytest.mark.parametrize("kernel", ["fbgemm", "native"])
def test_the_top_of_each_row_is_computed_again_from_the_dense_values(kernel):
    """8-bit activations cost most where one element dwarfs the others (a step of 60 / 127 here):
    the entries a greedy pick reads (each row's REFINE_TOP largest) come from the dense values,
    as the bfloat16 product of more rows computes them."""
    g = torch.Generator().manual_seed(0)
    qw = _head(torch.randn(4096, 1024, generator=g), kernel)
    x = torch.randn(3, 1024, generator=g)
    x[:, 0] = 60
    x = x.bfloat16()
    ref = x.float() @ qw.dense.float().t()
    out = qw.packed_matmul(x).float()
    top = out.topk(REFINE_TOP, dim=1).indices
    err = (out.gather(1, top) - ref.gather(1, top)).abs().max()
    assert err <= 0.01 * ref.abs().max(), err
    # each row's largest is the dense product's, its value the bfloat16 product's own
    dense = torch.bmm(qw.dense.unsqueeze(0).expand(3, -1, -1), x.unsqueeze(2)).squeeze(2)
    assert torch.equal(out.argmax(1), dense.float().argmax(1))
    assert torch.equal(out.amax(1), dense.float().amax(1))


@needs_vnni
@pytest.mark.parametrize("kernel", ["fbgemm", "native"])
def test_a_refined_rows_result_is_the_same_bits_in_any_product(kernel):
    qw = _head(_matrix(4096, 1024), kernel)
    x = _rows(VNNI_ROWS, 1024).bfloat16()
    alone = torch.cat([qw.packed_matmul(x[i : i + 1]) for i in range(len(x))])
    assert torch.equal(alone, qw.packed_matmul(x))
    assert torch.equal(alone, qw.packed_matmul(x.flip(0)).flip(0))
