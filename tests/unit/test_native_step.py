"""A small decode forward's layers in one native call (``engine.model.native_step``,
``kernels/cpu_step.cpp``): the same bits as the Python layers, in the output, the residual
stream and the KV pools, and taken only where it runs the kernels the Python layers run."""

from __future__ import annotations

import pytest
import torch

from engine.group.pipeline import Stage
from engine.model import fused
from engine.model.int_vnni import int_vnni_native
from engine.model.llama import LlamaModel
from engine.model.loader import load_model
from engine.model.native_step import DENSE_STEP_ROWS, NativeStep, why_not
from engine.model.orient import dense_f32, dense_pairs, dense_tiles
from engine.model.quant import SMALL_ROWS, plan_quant
from kernels import cpu_ops
from kernels.attention import LayerKV
from kernels.cpu_ops import cpu_flags
from kernels.paged_decode import native_slots
from kernels.select import get_backend
from kernels.torch_ref import SHORT_EXTEND
from tests.unit.paged_batch import make_paged_batch

pytestmark = pytest.mark.skipif(not cpu_ops.load(), reason=f"{cpu_ops.why_not()}")
BF16 = frozenset({"avx2", "avx512f", "avx512_bf16"})  # a plan with packed kernels on any CPU
VNNI = BF16 | {"avx512bw", "avx512dq", "avx512_vnni"}  # and the integer products, where built


def _model(path: str, mode: str = "int4", backend: str = "torch", **kw) -> LlamaModel:
    loaded = load_model(path)
    mode, _, ints = mode.partition("-")  # "int4-vnni": int4 with the integer products
    plan = plan_quant(mode, "cpu", flags=VNNI if ints else BF16, native=True)
    assert plan.int_vnni == (bool(ints) and int_vnni_native(cpu_flags()))
    be = get_backend(backend, "cpu", plan.dtype, 1)
    return LlamaModel(loaded.config, dict(loaded.weights), plan.dtype, be, quant=plan, **kw)


def _exact(path: str, orient: str, monkeypatch, dtype: torch.dtype = torch.bfloat16) -> LlamaModel:
    """Exact mode in ``dtype``, every dense product the one way ``orient`` (ATTEST_ORIENT)."""
    monkeypatch.setenv("ATTEST_ORIENT", orient)
    loaded = load_model(path)
    be = get_backend("torch", "cpu", dtype, 1)
    return LlamaModel(loaded.config, dict(loaded.weights), dtype, be)


def _kv_dtype(model: LlamaModel) -> torch.dtype:
    return model.quant.kv_dtype if model.quant is not None else model.dtype


def _batch(model: LlamaModel, spec: list[tuple[int, int]], seed: int):
    """A batch of ``spec`` (prefix, extend) per request, a pool per layer of the plan's KV
    dtype with the prefixes written, and token ids."""
    cfg = model.cfg
    pools = []
    for layer in range(cfg.num_layers):
        b = make_paged_batch(
            spec,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            dtype=_kv_dtype(model),
            seed=seed + layer,
        )
        pools.append(b.kv)
    ids = torch.randint(
        3, cfg.vocab_size, (b.meta.num_tokens,), generator=torch.Generator().manual_seed(seed)
    )
    return ids, b.meta, pools


def _copy(pools: list[LayerKV]) -> list[LayerKV]:
    return [LayerKV(kv.k.clone(), kv.v.clone()) for kv in pools]


@pytest.mark.parametrize("mode", ["int4", "int8", "int4-vnni", "int8-vnni"])
@pytest.mark.parametrize(
    "spec", [[(9, 1)], [(5, 1), (17, 1)], [(3, 1), (1, 1), (30, 1), (12, 1)], [(6, 3)], [(0, 4)]]
)
def test_the_native_layers_give_the_python_layers_bits(tiny_model_dir, mode, spec):
    """Decode batches of 1 to 4 rows, a request verifying three drafted tokens, a four-token
    prompt: the output, and every layer's pool, bit for bit."""
    model = _model(tiny_model_dir, mode)
    step = model.native_step
    assert step is not None and why_not(model) is None
    ids, meta, pools = _batch(model, spec, seed=len(spec))
    theirs = _copy(pools)
    got = model.forward(ids, meta, pools)
    model.native_step = None
    meta.scratch.clear()
    want = model.forward(ids, meta, theirs)
    assert torch.equal(got, want)
    for a, b in zip(pools, theirs):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    model.native_step = step


def _same_bits(model: LlamaModel, spec: list[tuple[int, int]], seed: int) -> None:
    """The one call's output and every layer's pool against the Python layers', bit for bit."""
    step = model.native_step
    ids, meta, pools = _batch(model, spec, seed=seed)
    assert step.takes(meta)
    theirs = _copy(pools)
    got = model.forward(ids, meta, pools)
    model.native_step = None
    meta.scratch.clear()
    want = model.forward(ids, meta, theirs)
    model.native_step = step
    assert torch.equal(got, want)
    for a, b in zip(pools, theirs):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("orient,way", [("linear", 0), ("mm", 1), ("packed", 2)])
@pytest.mark.parametrize("spec", [[(9, 1)], [(5, 1), (17, 1), (2, 1)], [(6, 3)], [(0, 4)]])
def test_exact_layers_give_the_python_layers_bits(
    tiny_model_dir, monkeypatch, orient, way, spec, dtype
):
    """Exact mode: each of the dense products' three ways (one row padded to two in the mm
    way; the packed way bfloat16's on AMX's tiles where the CPU has them, else on the native
    bfloat16 product on vectors where the native ops have AVX-512 BF16, float32's on the native
    float32 product), decodes, drafts, a short prompt; in float32 with torch's norms."""
    model = _exact(tiny_model_dir, orient, monkeypatch, dtype)
    # bfloat16's packed copies on AMX's tiles where the CPU has them (the native tile product)
    assert model.packed_tiles is (orient == "packed" and dtype == torch.bfloat16 and dense_tiles())
    # ... else on the native bfloat16 product on vectors where built with AVX-512 BF16
    pairs = orient == "packed" and dtype == torch.bfloat16 and dense_pairs() and not dense_tiles()
    assert model.packed_pairs is pairs
    # float32's on the native float32 product where the native ops are built with AVX-512
    assert model.packed_f32 is (orient == "packed" and dtype == torch.float32 and dense_f32())
    assert model.native_step.norm_rows == (0 if dtype == torch.float32 else fused.norm_rows())
    assert model.native_step is not None and why_not(model) is None
    assert model.native_step.way(len(spec)) == way
    _same_bits(model, spec, seed=len(spec) + way)


def test_rows_past_the_native_norms_bound_take_torchs_norms_as_the_python_layers_do(
    tiny_model_dir, monkeypatch
):
    """Where the native norms stop (a CPU whose norm loops are scalar), the call runs torch's
    add and norm past them, as the Python layers do."""
    monkeypatch.setattr(fused, "norm_rows", lambda: 2)
    model = _exact(tiny_model_dir, "measure", monkeypatch)
    assert model.native_step.norm_rows == 2
    native = []
    op = torch.ops.attest.dense_layers
    monkeypatch.setattr(torch.ops.attest, "dense_layers", lambda *a: native.append(a[6]) or op(*a))
    for rows in (2, 3, 16):
        _same_bits(model, [(4, 1)] * rows, seed=rows)
    assert native == [True, False, False]  # the native norms' rows, then torch's


def test_exact_bfloat16_takes_the_ways_measured_at_load(tiny_model_dir, monkeypatch):
    model = _exact(tiny_model_dir, "measure", monkeypatch)
    step, orient = model.native_step, model.orient
    for rows in (1, 2, 16, 64):
        want = 2 if orient.takes_packed(rows) else 1 if orient.takes_mm(rows) else 0
        assert step.way(rows) == want
    _same_bits(model, [(3, 1)] * 16, seed=16)


def test_a_prefill_chunk_runs_the_python_layers(tiny_model_dir, monkeypatch):
    """A request bringing more than SHORT_EXTEND tokens is attended by the extend kernels, not
    as rows: the Python layers run it, however few its tokens."""
    model = _exact(tiny_model_dir, "measure", monkeypatch)
    calls = []
    op = torch.ops.attest.dense_layers
    monkeypatch.setattr(torch.ops.attest, "dense_layers", lambda *a: calls.append(1) or op(*a))
    for spec, native in (([(0, SHORT_EXTEND)], 1), ([(0, SHORT_EXTEND + 1)], 0)):
        calls.clear()
        ids, meta, pools = _batch(model, spec, seed=3)
        model.forward(ids, meta, pools)
        assert len(calls) == native, spec


def test_it_runs_in_place_of_the_python_layers_up_to_its_rows(tiny_model_dir, monkeypatch):
    """Fast mode: a forward of at most its packed products' rows is one call of them, one of
    more up to ``rows`` one call of the dense values, one of more than that runs the layers."""
    model = _model(tiny_model_dir)
    step = model.native_step
    assert step.int_rows == model.quant.small_rows and step.rows == DENSE_STEP_ROWS
    calls = []
    for name in ("decode_layers", "dense_layers"):
        op = getattr(torch.ops.attest, name)
        monkeypatch.setattr(
            torch.ops.attest, name, lambda *a, n=name, op=op: calls.append(n) or op(*a)
        )
    ints = step.int_rows
    for rows, want in (
        (ints, ["decode_layers"]),
        (ints + 1, ["dense_layers"]),
        (DENSE_STEP_ROWS, ["dense_layers"]),
        (DENSE_STEP_ROWS + 1, []),
    ):
        calls.clear()
        ids, meta, pools = _batch(model, [(4, 1)] * rows, seed=rows)
        model.forward(ids, meta, pools)
        assert calls == want, rows


@pytest.mark.parametrize("mode", ["int4", "int8-vnni"])
def test_fast_modes_dense_values_past_its_packed_rows_give_the_python_layers_bits(
    tiny_model_dir, mode
):
    model = _model(tiny_model_dir, mode)
    rows = model.native_step.int_rows + 2
    _same_bits(model, [(5, 1)] * rows, seed=rows)


def test_a_bound_under_the_packed_kernels_floor_splits_where_the_python_layers_do(
    tiny_model_dir, monkeypatch
):
    """``ATTEST_INT_ROWS`` under ``SMALL_ROWS``: the call computes in integers exactly the rows
    the Python layers compute in integers, the rest from the dense values."""
    monkeypatch.setenv("ATTEST_INT_ROWS", str(SMALL_ROWS - 2))
    model = _model(tiny_model_dir, "int4-vnni")
    if model.quant.small_rows != SMALL_ROWS - 2:
        pytest.skip("the bound is measured only with the native integer products")
    assert model.native_step.int_rows == SMALL_ROWS - 2
    for rows in (SMALL_ROWS - 2, SMALL_ROWS - 1):
        _same_bits(model, [(7, 1)] * rows, seed=rows)


def test_it_is_not_taken_where_it_would_run_other_kernels(tiny_model_dir, monkeypatch):
    """The grouped decode path, a pipeline stage, or the switch off: the Python layers, each
    with its reason."""
    assert _model(tiny_model_dir).native_step is not None
    grouped = _model(tiny_model_dir)
    grouped.backend.decode = "grouped"
    assert "attention backend" in why_not(grouped)
    first_of_two = Stage()
    first_of_two.count = 2
    staged = _model(tiny_model_dir, stage=first_of_two)
    assert staged.native_step is None and "stage" in why_not(staged)
    monkeypatch.setenv("ATTEST_NATIVE_STEP", "0")
    off = _model(tiny_model_dir)
    assert off.native_step is None and "ATTEST_NATIVE_STEP=0" in why_not(off)
    assert NativeStep.build(grouped) is None


def test_the_call_refuses_lists_of_the_wrong_lengths(tiny_model_dir):
    model = _model(tiny_model_dir)
    step = model.native_step
    ids, meta, pools = _batch(model, [(4, 1)], seed=0)
    h = model.embed_tokens(ids)
    cos, sin = model.rope_cos_sin(meta.positions)
    with pytest.raises(RuntimeError, match="2 pools a layer"):
        torch.ops.attest.decode_layers(
            h,
            h.clone(),
            cos,
            sin,
            step.mats,
            step.scales,
            step.groups,
            step.norms,
            [pools[0].k],
            meta.out_slots,
            *native_slots(meta),
            step.dims,
            step.scale,
            step.eps,
        )
