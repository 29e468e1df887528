"""vLLM's arm for real, on a tiny model: its environment (build/vllm-venv, created here when it
is missing: about 2 minutes and more, so slow), the worker generating exactly what it is asked,
and `engine bench --table`'s measure API running Attest's exact arm and vLLM's float32 arm on the
same folder, with their ratio row, and bench/host_step.py's vLLM arm. vLLM compiles each batch shape on first use (a minute or
two each), so this test is long on a fresh machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from measure import vllm_cpu
from measure.table import TableSpec, format_report
from measure.three_way import run_table
from tests.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    vllm_cpu.ensure_env()
    # head size 32: the least vLLM's CPU attention takes
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=128)


def test_the_table_runs_attest_and_vllm_on_one_folder_with_ratios(tiny):
    spec = TableSpec(
        engines=["attest", "vllm"],
        attest=["exact"],
        vllm=["f32"],
        streams=[1, 4],
        prompt_len=16,
        output_len=8,
        prefill=32,
        runs=1,
        model=str(tiny),
    )
    run = run_table(spec, say=print)
    assert [(a.name, a.engine) for a in run.arms] == [
        ("attest exact", "attest"),
        ("vLLM f32", "vllm"),
    ]
    for arm in run.arms:
        assert sorted(arm.decode) == [1, 4] and arm.prefill
        assert all(d > 0 and e > 0 for ((d, e),) in arm.decode.values())
    [note] = [n for n in run.notes if n.startswith("vLLM f32:")]
    assert "vllm-cpu 0.32.0" in note and "dtype float32" in note and "prefix caching off" in note
    assert "VLLM_CPU_KVCACHE_SPACE=2" in note and "VLLM_CPU_NUM_OF_RESERVED_CPU=0" in note
    text = format_report(run.rounds, spec, run.notes)
    assert "| attest exact / vLLM f32 |" in text


def test_the_worker_generates_exactly_what_it_is_asked_greedy_and_repeatable(tiny):
    ws = vllm_cpu.WorkerSpec(str(tiny), "float32", max_seqs=3, max_len=64)
    with vllm_cpu.VllmWorker(vllm_cpu.ENV, ws) as w:
        vocab = w.info["vocab"]
        a, b, c = ([3 + (7 * i + k) % (vocab - 3) for k in range(12)] for i in range(3))
        w.generate([a], 6)
        alone = w.tokens[0]
        w.generate([b, a, c], 6)  # a beside others: batching does not change its greedy tokens
        assert w.tokens[1] == alone
        assert all(len(t) == 6 and all(0 <= x < vocab for x in t) for t in w.tokens)
        assert w.info["dtype"] == "float32" and w.info["load_s"] > 0


def test_the_host_step_bench_times_vllm_beside_attest_on_one_tiny_model(tiny):
    """bench/host_step.py's vLLM arm: both engines' steps per second, each arm's ratio to
    Attest's, the model 128 wide for both."""
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(root / "bench" / "host_step.py"), "--engines", "attest,vllm"]
    cmd += ["--streams", "1,4", "--steps", "4", "--reps", "1"]
    out = subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True).stdout
    assert "tiny model (2 layers, hidden 128)" in out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    arms = {(r[0].strip(), r[1].strip()): r for r in rows[1:]}
    assert set(arms) == {("attest", "1"), ("vllm", "1"), ("attest", "4"), ("vllm", "4")}
    assert all(float(r[2]) > 0 for r in arms.values())
    assert arms[("attest", "4")][5].strip() == "1.00x"
