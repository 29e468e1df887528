"""Fast mode's weight-only quantisation: the formats, the kernel choice by rows, the plan by CPU."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.model.llama import linear
from engine.model.quant import (
    QuantWeight,
    bf16_native,
    cpu_flags,
    int4_group,
    plan_quant,
    quantize_int4,
    quantize_int8,
)

BF16_CPU = frozenset({"avx2", "avx512f", "avx512_bf16"})
AVX2_CPU = frozenset({"avx2", "fma"})
needs_bf16 = pytest.mark.skipif(
    not bf16_native(cpu_flags()),
    reason="this CPU has no bfloat16 units: the packed kernels are not used here",
)


def test_int8_rounds_each_weight_to_within_half_a_step():
    w = torch.randn(48, 96)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    err = (q.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-6).all())


def test_int4_rounds_each_weight_to_within_half_a_step_of_its_group():
    w = torch.randn(16, 128)
    q, scale, lo = quantize_int4(w, 32)
    assert q.dtype == torch.int32 and int(q.min()) >= 0 and int(q.max()) <= 15
    back = q.float().reshape(16, 4, 32) * scale[..., None] + lo[..., None]
    err = (back.reshape(16, 128) - w).abs().reshape(16, 4, 32)
    assert bool((err <= scale[..., None] / 2 + 1e-6).all())


def test_int4_is_lossless_on_weights_already_on_a_q4_1_grid():
    """A GGUF Q4_1 block is 32 weights as q * d + m with q in 0..15: re-quantised in groups of 32
    its values come back (the reason for the group size)."""
    g = torch.randint(0, 16, (16, 4, 32)).float()
    g[..., 0], g[..., 1] = 0, 15  # each block spans its whole range, as Q4_1's min/max do
    w = (g * torch.rand(16, 4, 1) * 0.1 + torch.randn(16, 4, 1)).reshape(16, 128)
    qw = QuantWeight(w, "int4", torch.float32, 0)
    assert qw.mode == "int4" and torch.allclose(qw.dense, w, atol=1e-5)


def test_int4_falls_back_to_int8_when_no_group_or_tile_fits():
    assert int4_group(576) == 32 and int4_group(100) is None
    assert QuantWeight(torch.randn(16, 100), "int4", torch.float32, 0).mode == "int8"
    assert QuantWeight(torch.randn(24, 64), "int4", torch.bfloat16, 4).mode == "int8"  # 24 rows
    assert QuantWeight(torch.randn(32, 64), "int4", torch.bfloat16, 4).mode == "int4"


@needs_bf16
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_packed_kernel_computes_the_dense_values_product(mode):
    torch.manual_seed(0)
    w = torch.randn(96, 128)
    qw = QuantWeight(w, mode, torch.bfloat16, 4)
    for rows in (1, 2, 4):
        x = torch.randn(rows, 128).bfloat16()
        ref = x.float() @ qw.dense.float().t()
        got = qw.packed_matmul(x).float()
        assert (got - ref).abs().max() <= 0.02 * ref.abs().max(), (mode, rows)


@needs_bf16
def test_linear_takes_the_packed_kernel_for_few_rows_and_the_dense_values_beyond(monkeypatch):
    qw = QuantWeight(torch.randn(64, 64), "int8", torch.bfloat16, 4)
    calls = []
    real = qw.packed_matmul
    monkeypatch.setattr(
        QuantWeight, "packed_matmul", lambda self, x: calls.append(len(x)) or real(x)
    )
    for rows in (1, 4, 5, 16):
        out = linear(torch.randn(rows, 64).bfloat16(), qw)
        assert out.shape == (rows, 64)
    assert calls == [1, 4]


def test_without_bfloat16_units_the_quantised_values_run_dequantised_in_float32():
    plan = plan_quant("int4", "cpu", AVX2_CPU)
    assert plan.dtype == torch.float32 and plan.small_rows == 0
    assert "float32" in plan.path
    qw = QuantWeight(torch.randn(32, 64), "int4", plan.dtype, plan.small_rows)
    assert qw.dense.dtype == torch.float32 and qw.packed_bytes == 0
    x = torch.randn(1, 64)
    assert torch.allclose(linear(x, qw), x @ qw.dense.t(), atol=1e-5)


@pytest.mark.parametrize(("native", "pool"), [(True, "bfloat16"), (False, "float32")])
def test_with_bfloat16_units_the_plan_takes_bf16_activations_and_a_pool_for_the_decode(
    native, pool
):
    """bfloat16 KV where the native decode reads it; float32 for torch's grouped products."""
    plan = plan_quant("int8", "cpu", BF16_CPU, native=native)
    assert plan.dtype == torch.bfloat16 and plan.small_rows > 0
    assert plan.kv_dtype == getattr(torch, pool) and plan.fields()["kv_dtype"] == pool
    assert plan.fields()["dtype"] == "bfloat16" and plan.fields()["mode"] == "int8"
    assert plan.path.endswith(f"{pool} KV pool")


def test_quant_is_refused_off_the_cpu_and_for_an_unknown_format():
    with pytest.raises(ValueError, match="CPU only"):
        plan_quant("int8", "cuda", BF16_CPU)
    with pytest.raises(ValueError, match="quant"):
        EngineConfig.from_kwargs(quant="int3")
    with pytest.raises(ValueError, match="cpu with --quant"):
        EngineConfig.from_kwargs(quant="int8", device="cuda", kv_tokens=1024)
