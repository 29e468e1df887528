"""Up to how many rows fast mode's layer matrices take the native integer products
(``engine.model.int_rows``): measured at load against their dense values, never below the
packed kernels' bound, fixed by ``ATTEST_INT_ROWS``, applied to every layer matrix and recorded
at boot."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch

import engine.model.int_rows as int_rows
from engine import LLM
from engine.model.int_rows import choose, measure
from engine.model.int_vnni import int_vnni_native
from engine.model.native_step import DENSE_STEP_ROWS, MATRICES
from engine.model.quant import SMALL_ROWS, QuantWeight
from kernels.cpu_ops import cpu_flags
from tests.fakes import Charged

SLOW = 0.02  # seconds a slowed call is charged on the measure's clock (tests.fakes.Charged)
ROWS = (SMALL_ROWS, 8, 16)

needs_ints = pytest.mark.skipif(
    not int_vnni_native(cpu_flags()), reason="no native integer products on this CPU"
)


def _mats() -> list[QuantWeight]:
    g = torch.Generator().manual_seed(0)
    return [QuantWeight(torch.randn(48, 64, generator=g), "int8", torch.bfloat16, SMALL_ROWS)]


def _dense(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    return x @ w.dense.t()


def test_integer_products_slower_from_the_first_count_above_the_bound_keep_the_bound(
    monkeypatch,
):
    """The bound's own count never lowers it, and the measure stops at the first count lost."""
    clock = Charged()
    monkeypatch.setattr(QuantWeight, "packed_matmul", clock.slowed(QuantWeight.packed_matmul))
    rows, took = measure(_mats(), _dense, ROWS, clock=clock)
    assert rows == SMALL_ROWS, took
    assert sorted(took) == [SMALL_ROWS, 8]
    assert all(ints > dense for ints, dense in took.values())


def test_integer_products_faster_at_every_count_take_the_largest():
    clock = Charged()
    rows, took = measure(_mats(), clock.slowed(_dense), ROWS, clock=clock)
    assert rows == 16 and sorted(took) == list(ROWS), took


def test_the_bound_is_the_last_count_of_an_unbroken_run_of_wins(monkeypatch):
    """Faster at 8 rows, slower at 16, faster again at 32: the bound is 8 (a product of 20 rows
    must not take the integer products because 32 rows did)."""
    slow_at, clock = {16}, Charged()
    dense = clock.slowed(_dense, lambda x, w: SLOW if len(x) not in slow_at else 0)
    monkeypatch.setattr(
        QuantWeight,
        "packed_matmul",
        clock.slowed(QuantWeight.packed_matmul, lambda w, x: SLOW * 2 if len(x) in slow_at else 0),
    )
    rows, took = measure(_mats(), dense, (SMALL_ROWS, 8, 16, 32), clock=clock)
    assert rows == 8 and sorted(took) == [SMALL_ROWS, 8, 16], took


def test_the_environment_fixes_the_bound_or_is_refused(monkeypatch):
    monkeypatch.setenv("ATTEST_INT_ROWS", "12")
    assert choose(_mats(), _dense, ROWS) == (12, {})
    for bad in ("0", "-3", "wide", "4.5"):
        monkeypatch.setenv("ATTEST_INT_ROWS", bad)
        with pytest.raises(ValueError, match="ATTEST_INT_ROWS must be"):
            choose(_mats(), _dense, ROWS)
    monkeypatch.setenv("ATTEST_INT_ROWS", "measure")
    clock = Charged()
    monkeypatch.setattr(int_rows, "measure", partial(int_rows.measure, clock=clock))
    rows, took = choose(_mats(), clock.slowed(_dense), ROWS)
    assert rows == 16 and sorted(took) == list(ROWS)


def _boot_weights(log) -> dict:
    lines = [json.loads(x) for x in log.read_text().splitlines() if '"boot.weights"' in x]
    assert len(lines) == 1
    return lines[0]


@needs_ints
def test_a_bound_fixed_by_the_environment_reaches_every_layer_matrix_and_the_boot_receipt(
    tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("ATTEST_INT_ROWS", "8")
    log = tmp_path / "boot.jsonl"
    llm = LLM(model=tiny_model_dir, kv_tokens=4096, quant="int4", log_file=str(log))
    model = llm.core.model
    assert model.quant.small_rows == 8
    assert {layer[k].small_rows for layer in model.layers for k in MATRICES} == {8}
    weights = _boot_weights(log)
    assert weights["small_rows"] == 8 and "int_rows" not in weights
    assert "up to 8 rows" in weights["path"] and "measured" not in weights["path"]
    assert weights["step_rows"] == DENSE_STEP_ROWS  # the one native call, dense values past 8
    llm.close()


@needs_ints
def test_a_measured_bound_is_what_each_product_takes_and_is_recorded(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Unfixed, the bound is measured at load: the dense values slowed far past the integer
    products, every row count measured wins, and a product of up to that many rows takes the
    integer product while one more row takes the dense values."""
    monkeypatch.delenv("ATTEST_INT_ROWS", raising=False)
    monkeypatch.setattr(int_rows, "ROWS", ROWS)
    import engine.model.llama as llama

    real, clock = llama.linear, Charged()

    def slowed(x, w, orient=None, packed=None):  # the dense values' products only
        if not isinstance(w, QuantWeight):
            clock.now += SLOW
        return real(x, w, orient, packed)

    monkeypatch.setattr(llama, "linear", slowed)
    monkeypatch.setattr(int_rows, "measure", partial(int_rows.measure, clock=clock))
    log = tmp_path / "boot.jsonl"
    llm = LLM(model=tiny_model_dir, kv_tokens=4096, quant="int8", log_file=str(log))
    model = llm.core.model
    assert model.quant.small_rows == 16
    weights = _boot_weights(log)
    assert weights["small_rows"] == 16 and "up to 16 rows (measured at load)" in weights["path"]
    assert sorted(int(n) for n in weights["int_rows"]) == list(ROWS)
    assert all(ints < dense for ints, dense in weights["int_rows"].values())
    w = model.layers[0]["qkv"]
    taken = []
    real_packed = QuantWeight.packed_matmul
    monkeypatch.setattr(
        QuantWeight, "packed_matmul", lambda s, x: taken.append(len(x)) or real_packed(s, x)
    )
    for n in (1, 16, 17):
        real(torch.randn(n, w.shape[1]).to(w.dense.dtype), w, model.orient)
    assert taken == [1, 16]
    llm.close()


@needs_ints
@pytest.mark.parametrize("why", ["two ranks", "two stages", "one matrix not in integers"])
def test_the_bound_stays_where_a_rank_or_matrix_could_compute_a_row_another_way(monkeypatch, why):
    """The speculator sizes its steps by the bound: a group whose ranks or stages measure their
    own, or a layer with a matrix outside the integer products, keeps the floor."""
    from types import SimpleNamespace

    from engine.model.int_rows import widen
    from engine.model.quant import plan_quant

    monkeypatch.setenv("ATTEST_INT_ROWS", "16")
    plan = plan_quant("int8", "cpu")
    g = torch.Generator().manual_seed(0)

    def layer(integer: bool) -> dict:
        return {
            k: QuantWeight(
                torch.randn(32, 64, generator=g),
                "int8",
                plan.dtype,
                plan.small_rows,
                int_vnni=integer,
            )
            for k in MATRICES
        }

    def model(world: int = 1, stages: int = 1, integer: bool = True) -> SimpleNamespace:
        return SimpleNamespace(
            quant=plan,
            layers=[layer(True), layer(integer)],
            comm=SimpleNamespace(world=world),
            stage=SimpleNamespace(count=stages),
        )

    kw = {
        "two ranks": {"world": 2},
        "two stages": {"stages": 2},
        "one matrix not in integers": {"integer": False},
    }[why]
    m = model(**kw)
    widen(m, MATRICES, _dense)
    assert plan.small_rows == SMALL_ROWS
    assert {w.small_rows for layer in m.layers for w in layer.values()} == {SMALL_ROWS}
    widen(model(), MATRICES, _dense)  # the same, on one rank and stage, in integers throughout
    assert plan.small_rows == 16


@needs_ints
def test_a_bound_fixed_under_the_packed_kernels_floor_keeps_the_native_step_at_that_bound(
    tiny_model_dir, monkeypatch
):
    """The one native call computes in integers up to the plan's bound, as the Python layers do
    (``tests/unit/test_native_step.py`` compares the bits), however low it is fixed."""
    from engine.model.native_step import why_not

    monkeypatch.setenv("ATTEST_INT_ROWS", str(SMALL_ROWS - 2))
    llm = LLM(model=tiny_model_dir, kv_tokens=4096, quant="int4", receipts=False)
    model = llm.core.model
    assert why_not(model) is None and model.native_step.int_rows == SMALL_ROWS - 2
    llm.close()


def test_the_bound_is_timed_over_every_layers_matrices(monkeypatch):
    """Each matrix read once a pass, as a forward reads them from memory: one layer's four timed
    again and again stay in the cache, where the integer form's fewer bytes count for nothing."""
    from types import SimpleNamespace

    import engine.model.int_rows as int_rows
    from engine.model.quant import plan_quant

    monkeypatch.delenv("ATTEST_INT_ROWS", raising=False)
    plan = plan_quant("int8", "cpu")
    g = torch.Generator().manual_seed(0)
    layers = [
        {
            k: QuantWeight(
                torch.randn(32, 64, generator=g), "int8", plan.dtype, plan.small_rows, int_vnni=True
            )
            for k in MATRICES
        }
        for _ in range(3)
    ]
    timed = []
    monkeypatch.setattr(
        int_rows, "measure", lambda mats, dense, rows: timed.append(list(mats)) or (8, {})
    )
    model = SimpleNamespace(
        quant=plan, layers=layers, comm=SimpleNamespace(world=1), stage=SimpleNamespace(count=1)
    )
    monkeypatch.setattr(plan, "int_vnni", True)
    int_rows.widen(model, MATRICES, _dense)
    assert [[id(w) for w in mats] for mats in timed] == [
        [id(layer[k]) for layer in layers for k in MATRICES]
    ]
    assert plan.small_rows == 8
