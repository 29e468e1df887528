"""Which way a float32 product runs (``engine.model.orient``): measured at load, the faster way
per row count, a product taking the bucket at or below its rows, and recorded at boot."""

from __future__ import annotations

import json

import pytest
import torch

import engine.model.orient as orient
from engine import LLM
from engine.model.llama import linear
from engine.model.native_step import MATRICES as orient_matrices
from engine.model.orient import (
    ROWS,
    Orientation,
    choose,
    dense_f32,
    dense_pairs,
    dense_tiles,
    gated_linear,
    measure,
    on_pairs,
    on_tiles,
    pack,
    packed_linear,
)
from kernels import cpu_ops
from kernels.timing import fastest_each
from tests.fakes import Charged

F_linear = torch.nn.functional.linear


def _mats() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(48, 32, generator=g), torch.randn(32, 48, generator=g)]


def test_a_product_takes_the_bucket_at_or_below_its_rows():
    o = Orientation((1, 2, 8), (True, False, True))
    assert [o.takes_mm(n) for n in (1, 2, 7, 8, 500)] == [True, False, False, True, True]
    assert o.fields() == [1, 8]


def test_the_ways_take_turns_so_a_busy_spell_slows_them_alike():
    """A spell of a busy machine over the first three timed calls: timed one way after the
    other, it fell on all of the faster way's calls and the slower way won."""
    clock, spell = Charged(), iter([1.0] * 3 + [0.0] * 100)

    def way(cost: float):
        def run() -> None:
            clock.now += cost + next(spell)

        return run

    took = fastest_each([way(0.01), way(0.02)], reps=3, warm=0, clock=clock)
    assert took == pytest.approx([0.01, 0.02])


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


@pytest.mark.parametrize("fast", ["packed", "linear"])
def test_the_packed_way_is_taken_where_it_is_the_fastest(monkeypatch, fast):
    """With the weights packed the measure times three ways: the two others charged, the packed
    one is chosen everywhere; packed charged, never (and without packs, never timed)."""
    clock = Charged()
    slow = ["linear", "by_mm"] if fast == "packed" else ["packed_linear"]
    for name in slow:
        target = orient.F if name == "linear" else orient
        monkeypatch.setattr(target, name, clock.slowed(getattr(target, name)))
    mats = _mats()
    got, took = measure(mats, (1, 4, 16), clock=clock, packs=[pack(w) for w in mats])
    assert got.packed == ((fast == "packed"),) * 3, took
    assert not any(got.mm) and all(len(t) == 3 for t in took.values())
    assert [got.takes_packed(n) for n in (1, 300)] == [fast == "packed"] * 2
    assert got.packed_fields() == ([1, 4, 16] if fast == "packed" else [])
    plain, took = measure(mats, (1, 4), clock=clock)
    assert plain.packed == () and not plain.uses_packed and all(len(t) == 2 for t in took.values())


@pytest.mark.parametrize("rows", [48, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_packed_way_computes_the_same_product(dtype, rows):
    """oneDNN's in bfloat16: the very bits of ``F.linear``; on AMX's tiles (a bfloat16 matrix
    of whole 32s, where the CPU has them), and in float32, the same product summed in another
    order."""
    w = torch.randn(rows, 32, generator=torch.Generator().manual_seed(0)).to(dtype)
    x = torch.randn(5, 32).to(dtype)
    o = Orientation((1,), (False,), (True,))
    packed = pack(w)
    assert on_tiles(packed) is (dtype == torch.bfloat16 and rows == 64 and dense_tiles())
    for n in (1, 2, 5):
        got = linear(x[:n], w, o, packed)
        ref = torch.nn.functional.linear(x[:n], w)
        if dtype == torch.bfloat16 and not on_tiles(packed):
            assert torch.equal(got, ref)
        elif dtype == torch.bfloat16:  # one rounding of another float32 sum
            torch.testing.assert_close(got, ref, atol=0, rtol=2**-8)
        else:
            assert torch.allclose(got, ref, atol=1e-5)
    assert torch.equal(linear(x, w, o), torch.nn.functional.linear(x, w))  # no packs: linear


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
    monkeypatch.setenv("ATTEST_ORIENT", "packed")
    packs = [pack(w) for w in _mats()]
    assert choose(_mats(), packs=packs).takes_packed(300)
    with pytest.raises(ValueError, match="no oneDNN"):
        choose(_mats())
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
    if cpu_ops.load():  # the tiny model's heads of 16: the decode kernel's general loops
        assert weights["attention"] == {"decode": "native, general loops", "extend": "sdpa"}
    llm.close()
    monkeypatch.setenv("ATTEST_ORIENT", "mm")
    llm = LLM(model=tiny_model_dir, kv_tokens=256, log_file=str(log))
    weights = [json.loads(x) for x in log.read_text().splitlines() if '"boot.weights"' in x][-1]
    assert weights["orient"] == {"layers": [1], "head": [1]}
    assert weights["prepacked"] == {
        "layers": [],
        "head": [],
        "bytes": 0,
        "tiles": False,
        "f32": False,
        "pairs": False,
    }
    llm.close()
    monkeypatch.setenv("ATTEST_ORIENT", "packed")
    llm = LLM(model=tiny_model_dir, kv_tokens=256, log_file=str(log))
    weights = [json.loads(x) for x in log.read_text().splitlines() if '"boot.weights"' in x][-1]
    model = llm.core.model
    mats = [layer[k] for layer in model.layers for k in orient_matrices] + [model.lm_head]
    bytes_ = sum(m.numel() * m.element_size() for m in mats)
    # float32: laid out for the native float32 product where the native ops are built with
    # AVX-512 (the tiny model's rows are whole 32s), else for oneDNN
    assert weights["prepacked"] == {
        "layers": [1],
        "head": [1],
        "bytes": bytes_,
        "tiles": False,
        "f32": dense_f32(),
        "pairs": False,
    }
    llm.close()
    # bfloat16: laid out for AMX's tiles where the CPU has them (the tiny model's rows and
    # columns are whole 32s), else for the native bfloat16 product on vectors where the native
    # ops have AVX-512 BF16, the same bytes
    llm = LLM(model=tiny_model_dir, kv_tokens=256, log_file=str(log), dtype="bfloat16")
    weights = [json.loads(x) for x in log.read_text().splitlines() if '"boot.weights"' in x][-1]
    pairs = dense_pairs() and not dense_tiles()
    assert weights["prepacked"]["tiles"] is dense_tiles()
    assert weights["prepacked"]["pairs"] is pairs
    assert weights["prepacked"]["bytes"] == bytes_ // 2
    assert on_tiles(llm.core.model.head_packed) is dense_tiles()
    assert on_pairs(llm.core.model.head_packed) is pairs
    llm.close()


@pytest.mark.parametrize("how", ["linear", "mm", "packed"])
def test_the_forward_runs_its_products_the_way_chosen(tiny_model_dir, monkeypatch, how):
    """Every float32 product of a generate (prefill and decode, layers and head) goes through
    ``F.linear`` under ``linear``, through the packed weights under ``packed``, and through
    neither under ``mm``."""
    import engine.model.llama as llama

    monkeypatch.setenv("ATTEST_ORIENT", how)
    # the Python layers' products, counted here (the one native call takes the same way, bit
    # for bit: tests/unit/test_native_step.py)
    monkeypatch.setenv("ATTEST_NATIVE_STEP", "0")
    llm = LLM(model=tiny_model_dir, kv_tokens=256, receipts=False)
    calls: dict[str, int] = {"linear": 0, "packed": 0}

    def counted(name, fn):
        return lambda x, w, *more: calls.__setitem__(name, calls[name] + 1) or fn(x, w, *more)

    monkeypatch.setattr(torch.nn.functional, "linear", counted("linear", F_linear))
    monkeypatch.setattr(llama, "packed_linear", counted("packed", packed_linear))
    # the gate/up product, packed, with its activation (orient.gated_linear)
    monkeypatch.setattr(llama, "gated_linear", counted("packed", gated_linear))
    from engine import SamplingParams

    llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    layers = llm.core.model_config.num_layers
    # 4 products a layer and the head, for the prefill and each of the 2 decode forwards
    every = 3 * (4 * layers + 1)
    assert calls == {"linear": every * (how == "linear"), "packed": every * (how == "packed")}
    llm.close()


def test_bfloat16_tokens_are_the_same_packed_or_not(tiny_model_dir, monkeypatch):
    """bfloat16's packed products (oneDNN's: ``F.linear``'s bits; on AMX's tiles: one rounding
    of another float32 sum) give the same greedy tokens."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got = {}
    for how in ("linear", "packed"):
        monkeypatch.setenv("ATTEST_ORIENT", how)
        llm = LLM(model=tiny_model_dir, kv_tokens=256, receipts=False, dtype="bfloat16")
        assert llm.core.model.head_packed is not None or how == "linear"
        got[how] = [o.token_ids for o in llm.generate([[5, 6, 7, 8], [9, 3, 4]], params)]
        llm.close()
    assert got["linear"] == got["packed"]


def test_fast_mode_packs_its_dense_values_where_chosen_and_runs_them_packed(
    tiny_model_dir, monkeypatch
):
    """Fast mode's dense values (a product past its integer rows) are measured packed too: where
    chosen, each quantised matrix keeps its own packed copy, the boot counts their bytes, a
    prefill's products run on them, and in bfloat16 (``F.linear``'s bits) the greedy tokens are
    the unpacked ones."""
    import engine.model.llama as llama
    from engine import SamplingParams

    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    calls = []
    monkeypatch.setattr(
        llama, "packed_linear", lambda x, p, *w: calls.append(len(x)) or packed_linear(x, p, *w)
    )
    monkeypatch.setattr(
        llama, "gated_linear", lambda x, p, f: calls.append(len(x)) or gated_linear(x, p, f)
    )
    # the Python layers' products, counted here (the one native call runs the same ones and is
    # compared with them bit for bit in tests/unit/test_native_step.py)
    monkeypatch.setenv("ATTEST_NATIVE_STEP", "0")
    got, dtypes = {}, set()
    for how in ("linear", "packed"):
        monkeypatch.setenv("ATTEST_ORIENT", how)
        llm = LLM(model=tiny_model_dir, kv_tokens=256, receipts=False, quant="int8")
        model = llm.core.model
        mats = [layer[k] for layer in model.layers for k in orient_matrices] + [model.lm_head]
        dtypes |= {w.dense.dtype for w in mats}
        kept = [w.dense_packed is not None for w in mats]
        assert kept == [how == "packed"] * len(mats)
        assert model.packed_bytes == (how == "packed") * sum(w.dense_bytes for w in mats)
        assert model.head_packed is None and all("packed" not in layer for layer in model.layers)
        calls.clear()
        got[how] = [o.token_ids for o in llm.generate([[5, 6, 7, 8, 9, 10], [9, 3, 4]], params)]
        # the prefill's 9 rows are past the integer rows (4): its 4 products a layer run packed
        assert calls.count(9) == (how == "packed") * 4 * len(model.layers), calls
        llm.close()
    if dtypes == {torch.bfloat16}:
        assert got["linear"] == got["packed"]


def test_every_product_is_laid_out_row_by_row_whichever_way_it_takes(tiny_model_dir, monkeypatch):
    """``(W @ x.T).T`` is a transposed view; what follows a product reads rows (the native
    norm and SiLU times up take dense rows only; the sampler, the grammars' masks written in
    place), so the mm way runs, and is timed, with a copy laid out row by row."""
    for how in ("mm", "linear", "measure"):
        monkeypatch.setenv("ATTEST_ORIENT", how)
        llm = LLM(model=tiny_model_dir, kv_tokens=256, receipts=False)
        model = llm.core.model
        for n in (1, 3, 16):
            hidden = torch.randn(n, llm.core.model_config.hidden_size, dtype=model.dtype)
            out = model.logits(hidden)
            assert out.is_contiguous() and out.shape == (n, llm.core.model_config.vocab_size)
            for k in orient_matrices:
                w = model.layers[0][k]
                x = torch.randn(n, w.shape[1], dtype=model.dtype)
                assert linear(x, w, model.orient).is_contiguous(), (how, k)
        llm.close()


def test_bfloat16_logits_are_the_heads_product_in_float32_widened_where_packed(
    tiny_model_dir, monkeypatch
):
    """The LM head's logits (float32) are its bfloat16 product's ``.float()``, bit for bit,
    whether the product stores them widened (packed on the tiles) or is widened after."""
    monkeypatch.setenv("ATTEST_ORIENT", "packed")
    llm = LLM(model=tiny_model_dir, kv_tokens=256, receipts=False, dtype="bfloat16")
    model = llm.core.model
    for n in (1, 3, 16, 40):
        hidden = torch.randn(n, llm.core.model_config.hidden_size).to(torch.bfloat16)
        got = model.logits(hidden)
        want = packed_linear(hidden, model.head_packed).float()
        assert got.dtype == torch.float32 and got.is_contiguous()
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), n
    llm.close()
