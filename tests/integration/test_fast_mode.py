"""Fast mode end to end: a model whose weights lie on a Q4_1 grid (as the default model's file
does) served with int4 and int8 weights, against exact mode on the same file."""

from __future__ import annotations

import json
import random

import pytest

from engine import LLM, SamplingParams
from engine.model.int_vnni import int_vnni_native
from engine.model.native_step import DENSE_STEP_ROWS
from engine.model.quant import QuantWeight, quantize_int4
from kernels import cpu_ops
from kernels.cpu_ops import cpu_flags
from measure.agreement import PROMPTS, greedy_agreement
from tests.conftest import requires_default_model
from tests.tiny_model import make_tiny_model

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory):
    """The tiny model with every linear weight snapped to 4-bit groups of 32 (scale + minimum
    per group, as GGUF's Q4_1 stores them)."""
    from safetensors.torch import load_file, save_file

    d = make_tiny_model(tmp_path_factory.mktemp("q4"), seed=3)
    path = next(d.glob("*.safetensors"))
    w = load_file(str(path))
    for name, t in w.items():
        if any(k in name for k in LINEAR) or name == "model.embed_tokens.weight":
            q, scale, lo = quantize_int4(t, 32)
            n, k = t.shape
            back = q.float().reshape(n, k // 32, 32) * scale[..., None] + lo[..., None]
            w[name] = back.reshape(n, k).to(t.dtype).contiguous()
    save_file(w, str(path))
    return str(d)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(rng.randrange(4, 24))] for _ in range(n)]


def test_int4_boots_says_so_and_agrees_with_exact_mode(q4_model, tmp_path):
    log = tmp_path / "boot.jsonl"
    exact = LLM(model=q4_model, kv_tokens=4096, receipts=False)
    fast = LLM(model=q4_model, kv_tokens=4096, quant="int4", log_file=str(log))
    info = fast.core.describe()
    assert info["weights"] == "int4" and "int4" in info["weights_path"]
    weights = [json.loads(x) for x in log.read_text().splitlines() if '"boot.weights"' in x]
    assert len(weights) == 1
    layers = fast.core.model_config.num_layers
    # four matrices a layer (qkv, o, gate_up, down) in int4; the LM head in int8
    assert weights[0]["matrices"] == {"int4": 4 * layers, "int8": 1}
    assert weights[0]["mode"] == "int4" and weights[0]["dtype"] == info["dtype"]
    # where the packed kernels and the native ops run, a decode forward's layers are one call
    runs = fast.core.quant.small_rows > 0 and cpu_ops.load()
    assert weights[0]["step_rows"] == (DENSE_STEP_ROWS if runs else 0)
    # where the CPU has AVX-512 VNNI, the layer products of those rows are integer ones
    ints = runs and int_vnni_native(cpu_flags())
    assert weights[0]["int_vnni"] is ints and ("integer products" in weights[0]["path"]) is ints
    a = greedy_agreement(exact, fast, _prompts(6), 16)
    assert a.share >= 0.9, (a.share, a.common_prefix)
    fast.close()
    exact.close()


def test_int8_decodes_batches_on_both_sides_of_the_kernel_switch(q4_model, monkeypatch):
    """Up to small_rows rows take the packed kernel, more take the dense values: a batch that
    shrinks from 6 to 1 as its requests finish crosses the switch, and every request ends."""
    rows = []
    packed = QuantWeight.packed_matmul
    monkeypatch.setattr(
        QuantWeight, "packed_matmul", lambda w, x: rows.append(len(x)) or packed(w, x)
    )
    fast = LLM(model=q4_model, kv_tokens=4096, quant="int8", receipts=False)
    params = [
        SamplingParams(max_tokens=3 + 4 * i, temperature=0, ignore_eos=True) for i in range(6)
    ]
    outs = fast.generate(_prompts(6, seed=1), params)
    assert [len(o.token_ids) for o in outs] == [3 + 4 * i for i in range(6)]
    small = fast.core.quant.small_rows
    if small:  # a CPU with bfloat16 units: decodes of 1..small rows packed, 5 and 6 dense
        assert set(rows) == set(range(1, small + 1)), sorted(set(rows))
    dense = fast.core.model.layers[0]["qkv"].dense
    assert dense.dtype == fast.core.dtype
    assert fast.core.kv.dtype == fast.core.quant.kv_dtype  # the pool the plan chose
    fast.close()


@pytest.mark.slow
@requires_default_model
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_default_model_fast_mode_agrees_with_exact_mode_on_held_out_prompts(mode):
    exact = LLM(kv_tokens=16384, receipts=False)
    prompts = [exact.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    fast = LLM(kv_tokens=16384, receipts=False, quant=mode)
    a = greedy_agreement(exact, fast, prompts, 32)
    print(f"{mode}: {a.equal}/{a.positions} = {a.share:.3f}; common prefixes {a.common_prefix}")
    assert a.share >= 0.9
