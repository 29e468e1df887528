"""The shipped foreign windows (sglang_pressure, vllm_pressure) over the lines real runs write:
each crash and OOM line either engine prints fails the claim that watches for it, and the same
words anywhere else (a prompt, another program's line) do not."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from audit.spec import acceptance_dir, load_spec
from audit.verdict import evaluate


def case_log(window: str, case: str) -> str:
    path = acceptance_dir() / window / "cases" / f"{case}.toml"
    return tomllib.loads(path.read_text(encoding="utf-8"))["log"]


def verdicts(tmp_path: Path, window: str, text: str) -> dict[str, str]:
    log = tmp_path / "server.log"
    log.write_text(text, encoding="utf-8")
    report = evaluate([load_spec(acceptance_dir() / window)], [log])
    return {c.claim: str(c.status) for c in report.specs[0].claims}


SGLANG_MODEL = "--model-path Qwen/Qwen2.5-7B-Instruct --tp-size 2 --port 30000"

SIGNALS = [
    # SGLang: the server's SIGQUIT handler once running, and while launching (some releases
    # wrote 'proces'); a shell's job status for the killed server; a 2024 scheduler's exception
    (
        "sglang_pressure",
        "no_crash",
        "[2026-03-15 03:28:35] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
    ),
    (
        "sglang_pressure",
        "no_crash",
        "[2025-06-01 12:00:31] SIGQUIT received. signum=3, frame=<frame at 0x7f3c2c0b5a40, file "
        "'/usr/lib/python3.10/site-packages/uvicorn/server.py', line 68, code serve>. It usually "
        "means one child failed.",
    ),
    ("sglang_pressure", "no_crash", "[2025-01-01 12:00:31] Received sigquit from a child proces."),
    (
        "sglang_pressure",
        "no_crash",
        "[2025-01-01 12:00:31] Received sigquit from a child proces. It usually means the child failed.",
    ),
    (
        "sglang_pressure",
        "no_crash",
        f"./run.sh: line 3: 12345 Killed                  python -m sglang.launch_server {SGLANG_MODEL}",
    ),
    (
        "sglang_pressure",
        "no_crash",
        f"[1]+  Killed                  python3 -m sglang.launch_server {SGLANG_MODEL}",
    ),
    ("sglang_pressure", "no_crash", "[2024-07-20 10:00:31 TP0] Exception in ModelTpServer:"),
    # vLLM: the API server giving up on a dead engine; the engine's one-line summary of a CUDA
    # OOM, with no traceback after it
    (
        "vllm_pressure",
        "no_crash",
        "CRITICAL 12-06 14:09:39 launcher.py:99] MQLLMEngine is already dead, terminating server process",
    ),
    (
        "vllm_pressure",
        "no_crash",
        "(APIServer pid=1) CRITICAL 03-30 02:15:01 [launcher.py:116] MQLLMEngine is already dead, "
        "terminating server process",
    ),
    (
        "vllm_pressure",
        "no_crash",
        "./serve.sh: line 9: 31337 Killed                  vllm serve Qwen/Qwen2.5-7B-Instruct --port 8000",
    ),
    (
        "vllm_pressure",
        "no_oom",
        "ERROR 01-08 09:20:26 engine.py:135] OutOfMemoryError('CUDA out of memory. Tried to allocate "
        "2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free. Of the allocated "
        "memory 75.02 GiB is allocated by PyTorch.')",
    ),
    (
        "vllm_pressure",
        "no_oom",
        "(EngineCore_DP0 pid=3801) ERROR 05-19 10:13:15 [core.py:710] "
        "RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB.')",
    ),
]


@pytest.mark.parametrize(("window", "claim", "line"), SIGNALS)
def test_a_crash_or_oom_line_fails_its_claim(tmp_path, window, claim, line):
    assert verdicts(tmp_path, window, case_log(window, "pass"))[claim] == "PASS"
    got = verdicts(tmp_path, window, case_log(window, "pass") + line + "\n")
    assert got[claim] == "FAIL", line


NOT_SIGNALS = [
    # the operator's own stop, and another program killed, are not the server crashing
    (
        "sglang_pressure",
        "no_crash",
        f"./run.sh: line 3: 12345 Terminated  python -m sglang.launch_server {SGLANG_MODEL}",
    ),
    (
        "sglang_pressure",
        "no_crash",
        "./run.sh: line 5: 12399 Killed                  python bench_serving.py --num-prompts 64",
    ),
    # the words quoted in a prompt SGLang logs, or bare from a client
    (
        "sglang_pressure",
        "no_crash",
        "[2025-01-01 12:00:31] Receive: obj=GenerateReqInput(text='SIGQUIT received. signum=None, "
        "frame=None. It usually means one child failed.')",
    ),
    ("sglang_pressure", "no_crash", "client: Exception in ModelTpServer:"),
    (
        "vllm_pressure",
        "no_crash",
        "INFO 01-22 18:28:11 logger.py:37] Received request cmpl-9-0: prompt: 'MQLLMEngine is "
        "already dead, terminating server process', params: SamplingParams(n=1, max_tokens=16)",
    ),
    (
        "vllm_pressure",
        "no_oom",
        "INFO 01-22 18:28:11 logger.py:37] Received request cmpl-9-0: prompt: \"OutOfMemoryError('CUDA "
        "out of memory.')\", params: SamplingParams(n=1, max_tokens=16)",
    ),
]


@pytest.mark.parametrize(("window", "claim", "line"), NOT_SIGNALS)
def test_the_same_words_elsewhere_fail_nothing(tmp_path, window, claim, line):
    got = verdicts(tmp_path, window, case_log(window, "pass") + line + "\n")
    assert got[claim] == "PASS", line
