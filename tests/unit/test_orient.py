"""Which way a float32 product runs (``engine.model.orient``): measured at load, the faster way
per row count, a product taking the bucket at or below its rows, and recorded at boot."""

from __future__ import annotations

import json

import pytest
import torch

import engine.model.orient as orient
from engine import LLM
from engine.model.llama import linear
from engine.model.orient import ROWS, Orientation, choose, measure
from tests.fakes import Charged


def _mats() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(48, 32, generator=g), torch.randn(32, 48, generator=g)]


def test_a_product_takes_the_bucket_at_or_below_its_rows():
    o = Orientation((1, 2, 8), (True, False, True))
    assert [o.takes_mm(n) for n in (1, 2, 7, 8, 500)] == [True, False, False, True, True]
    assert o.fields() == [1, 8]


@pytest.mark.parametrize("slow", ["by_mm", "linear"])
def test_the_measure_picks_the_faster_way_at_every_row_count(monkeypatch, slow):
    """One way charged far more than the products take (on the measure's own clock, which
    the real products leave still): the other is chosen everywhere."""
    clock = Charged()
    if slow == "by_mm":
        monkeypatch.setattr(orient, "by_mm", clock.slowed(orient.by_mm))
    else:
        monkeypatch.setattr(orient.F, "linear", clock.slowed(orient.F.linear))
    got, took = measure(_mats(), (1, 4, 16), clock=clock)
    assert got.mm == ((slow == "linear"),) * 3, took
    assert sorted(took) == [1, 4, 16]


def test_both_ways_compute_the_same_product():
    w, x = _mats()[0], torch.randn(5, 32)
    ref = x.double() @ w.double().t()
    for o in (Orientation((1,), (True,)), Orientation((1,), (False,))):
        for n in (1, 2, 5):
            assert torch.allclose(linear(x[:n], w, o).double(), ref[:n], atol=1e-5)


def test_the_environment_fixes_one_way_or_is_refused(monkeypatch):
    monkeypatch.setenv("ATTEST_ORIENT", "linear")
    assert choose(_mats()) == Orientation((1,), (False,))
    monkeypatch.setenv("ATTEST_ORIENT", "mm")
    assert choose(_mats()).takes_mm(300)
    monkeypatch.setenv("ATTEST_ORIENT", "sideways")
    with pytest.raises(ValueError, match="ATTEST_ORIENT must be"):
        choose(_mats())
    monkeypatch.setenv("ATTEST_ORIENT", "measure")
    assert choose(_mats()).rows == ROWS


def test_the_boot_receipt_says_which_way_runs(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTEST_ORIENT", "linear")
    log = tmp_path / "boot.jsonl"
    llm = LLM(model=tiny_model_dir, kv_tokens=256, log_file=str(log))
    [weights] = [json.loads(x) for x in log.read_text().splitlines() if '"boot.weights"' in x]
    assert weights["orient"] == {"layers": [], "head": []}
    llm.close()
    monkeypatch.setenv("ATTEST_ORIENT", "mm")
    llm = LLM(model=tiny_model_dir, kv_tokens=256, log_file=str(log))
    weights = [json.loads(x) for x in log.read_text().splitlines() if '"boot.weights"' in x][-1]
    assert weights["orient"] == {"layers": [1], "head": [1]}
    llm.close()


@pytest.mark.parametrize("how", ["linear", "mm"])
def test_the_forward_runs_its_products_the_way_chosen(tiny_model_dir, monkeypatch, how):
    """Every float32 product of a generate (prefill and decode, layers and head) goes through
    ``F.linear`` under ``linear`` and never under ``mm``."""
    monkeypatch.setenv("ATTEST_ORIENT", how)
    llm = LLM(model=tiny_model_dir, kv_tokens=256, receipts=False)
    calls = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w: calls.append(1) or real(x, w))
    from engine import SamplingParams

    llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    layers = llm.core.model_config.num_layers
    # 4 products a layer and the head, for the prefill and each of the 2 decode forwards
    assert len(calls) == (3 * (4 * layers + 1) if how == "linear" else 0)
    llm.close()
