"""bench/gpu_check.py without a GPU: its arithmetic, its table, its guards, and its sections
run on CPU tensors (Triton's interpreter) so the script meets the GPU already exercised."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import tests.triton_interpret  # noqa: F401  (before any triton import: selects the interpreter)
from tests.triton_interpret import interpreted_kernels

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


@pytest.fixture
def gc(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_decode_bytes_counts_kv_table_query_and_output(gc):
    # 2 requests x 100 tokens, 3 KV heads of 64 in bf16: K and V, int64 slots, q and out
    got = gc.decode_bytes(batch=2, context=100, heads=9, kv_heads=3, head_dim=64, itemsize=2)
    assert got == 2 * 2 * 100 * 3 * 64 * 2 + 2 * 100 * 8 + 2 * 2 * 9 * 64 * 2


def test_bandwidth_arithmetic(gc):
    assert gc.achieved_gbps(4_800 * 10**9, 1.0) == pytest.approx(4800.0)
    assert gc.achieved_gbps(10**9, 0.5) == pytest.approx(2.0)
    assert gc.floor_us(4_800_000, 4800.0) == pytest.approx(1.0)
    assert gc.floor_us(1000, None) is None
    assert gc.hbm_peak_gbps("NVIDIA H200") == 4800.0
    assert gc.hbm_peak_gbps("NVIDIA H100 PCIe") == 2000.0  # the longest matching name wins
    assert gc.hbm_peak_gbps("NVIDIA H100 80GB HBM3") == 3350.0
    assert gc.hbm_peak_gbps("Some Future GPU") is None


def test_decode_tokens_per_s_subtracts_the_prefill_run(gc):
    # 64 streams, 65 tokens each: 64 decode steps took 2.0 - 0.4 s
    assert gc.decode_tokens_per_s(64, 65, 0.4, 2.0) == pytest.approx(64 * 64 / 1.6)
    assert gc.decode_tokens_per_s(1, 10, 1.0, 1.0) != gc.decode_tokens_per_s(1, 10, 1.0, 1.0)


def test_table_aligns_its_columns(gc):
    rows = [gc.Row("env", "device", "NVIDIA H200", "141 GiB"), gc.Row("decode", "B=1", "PASS")]
    lines = gc.render_table(rows).splitlines()
    assert lines[0].split() == ["section", "check", "result", "detail"]
    assert set(lines[1]) == {"-"}
    assert lines[2].index("NVIDIA H200") == lines[3].index("PASS") == lines[0].index("result")


def test_parse_args_defaults_fit_the_time_limit(gc):
    a = gc.parse_args([])
    assert a.budget_s < 8 * 60 and not a.skip_serve and a.json is None
    assert gc.parse_args(["--hbm-gbps", "3000", "--skip-serve"]).hbm_gbps == 3000.0
    assert a.sections == ["correct", "decode", "serve"] and a.backends == ["triton", "flashinfer"]


def test_sections_and_backends_are_chosen_by_name(gc, capsys):
    a = gc.parse_args(["--sections", "serve, decode", "--backends", "flashinfer"])
    assert a.sections == ["serve", "decode"] and a.backends == ["flashinfer"]
    assert gc.parse_args(["--skip-serve"]).sections == ["correct", "decode"]
    assert gc.parse_args(["--sections", "graphs"]).sections == ["graphs"]
    with pytest.raises(SystemExit):
        gc.parse_args(["--sections", "correct,speed"])
    assert "--sections: unknown speed" in capsys.readouterr().err


def test_a_failing_section_is_a_row_and_the_run_goes_on(gc):
    chk = gc.Check(budget_s=100)
    chk.section("one", lambda: 1 / 0)
    chk.section("two", lambda: chk.add("two", "x", "PASS"))
    assert [(r.section, r.result) for r in chk.rows] == [("one", "ERROR"), ("two", "PASS")]
    assert "ZeroDivisionError" in chk.rows[0].detail
    late = gc.Check(budget_s=-1)
    late.section("three", lambda: late.add("three", "x", "PASS"))
    assert [(r.section, r.result) for r in late.rows] == [("three", "SKIP")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_it_prints_the_table_and_fails(gc, capsys, tmp_path):
    out = tmp_path / "rows.json"
    assert gc.main(["--json", str(out)]) == 1
    text = capsys.readouterr().out
    assert "no CUDA device visible" in text and text.rstrip().endswith("s in all")
    assert "section  check" in text
    assert '"result": "ERROR"' in out.read_text()


def shrink(gc, monkeypatch):
    monkeypatch.setattr(gc, "DEVICE", "cpu")
    monkeypatch.setattr(gc, "CASES", {"extend": [(5, 7), (0, 3)], "decode": [(9, 1), (0, 1)]})
    monkeypatch.setattr(gc, "CORRECT_SHAPES", [(4, 2, 16)])
    monkeypatch.setattr(gc, "DECODE_SIZES", [(2, 40)])
    monkeypatch.setattr(gc, "SHAPES", {"tiny": (4, 2, 16)})


def test_sections_run_on_cpu_under_the_interpreter(gc, monkeypatch, tiny_model_dir):
    if interpreted_kernels() is None:
        pytest.skip("needs triton running under its interpreter")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    shrink(gc, monkeypatch)
    chk = gc.Check(budget_s=600)
    status = {"triton": None, "flashinfer": "not installed"}
    args = gc.parse_args(["--iters", "2", "--new-tokens", "3", "--prompt-tokens", "6"])
    chk.section("correct", lambda: gc.section_correctness(chk, status))
    chk.section("decode", lambda: gc.section_decode_speed(chk, status, args))
    monkeypatch.setattr(gc, "MODEL", tiny_model_dir)
    monkeypatch.setattr(gc, "STREAMS", (1, 3))
    torch_only = {"triton": "skipped here", "flashinfer": "not installed"}
    chk.section("serve", lambda: gc.section_serve(chk, torch_only, args))
    results = {(r.section, r.check): r.result for r in chk.rows}
    errors = [r for r in chk.rows if r.result in ("ERROR", "FAIL")]
    assert not errors, errors
    assert results[("correct", "triton extend bfloat16 page 16")] == "PASS"
    assert results[("correct", "triton decode float32 page 1")] == "PASS"
    assert results[("correct", "flashinfer")] == "SKIP"
    decode = next(r for r in chk.rows if r.check == "tiny B=2 ctx=40")
    assert "torch " in decode.detail and "triton " in decode.detail and "GB/s" in decode.detail
    assert results[("serve", "torch 1 streams")].endswith("tok/s")
    assert results[("serve", "torch 3 streams")].endswith("tok/s")


def test_graphs_section_runs_the_big_shape_shrunk_on_cpu(gc, monkeypatch):
    if interpreted_kernels() is None:
        pytest.skip("needs triton running under its interpreter")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    shrink(gc, monkeypatch)
    small = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2)
    monkeypatch.setattr(
        gc, "LLAMA_8B", {**small, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16}
    )
    monkeypatch.setattr(gc, "BIG_CONTEXT", 24)
    monkeypatch.setattr(gc, "STREAMS", (1, 3))
    chk = gc.Check(budget_s=600)
    status = {"triton": None, "flashinfer": "not installed"}
    args = gc.parse_args(["--iters", "2", "--hbm-gbps", "1000"])
    chk.section("graphs", lambda: gc.section_graphs_big(chk, status, args))
    errors = [r for r in chk.rows if r.result in ("ERROR", "FAIL")]
    assert not errors, errors
    rows = {r.check: r for r in chk.rows}
    assert rows["llama-8b triton eager batch 3"].result.endswith("tok/s")
    assert "x the floor" in rows["llama-8b triton graphs batch 3"].detail
    floor = next(r for r in chk.rows if r.check.startswith("llama-8b floor"))
    # the weights a step reads: 2 layers' matrices and norms, the final norm, the LM head
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    nbytes = 2 * (2 * layer + 64 + 320 * 64)
    assert floor.result == f"{nbytes / 1e12 * 1e3:.2f} ms"


def test_graphs_section_times_each_mode_and_says_the_ratios(gc, monkeypatch, tiny_model_dir):
    """Eager, graphs and graphs with overlap, each an engine of its own keywords (on the CPU the
    torch backend stands in and no graph is captured: that row says FAIL, the others run)."""
    from engine import LLM

    built: list[dict] = []

    def tiny_llm(backend, **extra):
        built.append(extra)
        return LLM(model=tiny_model_dir, kv_tokens=4096, receipts=False, **extra)

    monkeypatch.setattr(gc, "default_llm", tiny_llm)
    monkeypatch.setattr(gc, "STREAMS", (1, 3))
    chk = gc.Check(budget_s=600)
    args = gc.parse_args(["--new-tokens", "3", "--prompt-tokens", "6"])
    status = {"triton": None, "flashinfer": "not installed"}
    chk.section("graphs", lambda: gc.section_graphs_default(chk, status, args))
    assert built == [{"speculative": "off"} | kw for kw in gc.GRAPH_MODES.values()]
    rows = {r.check: r.result for r in chk.rows}
    assert rows["triton captured"] == "FAIL"  # a CPU has no CUDA graphs
    for mode in gc.GRAPH_MODES:
        assert rows[f"triton {mode} 3 streams"].endswith("tok/s")
    for ratio in ("graphs/eager", "graphs+overlap/graphs"):
        assert rows[f"triton {ratio} 1 streams"].endswith("x")
