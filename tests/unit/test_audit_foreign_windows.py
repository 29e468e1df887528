"""The shipped foreign windows (sglang_pressure, vllm_pressure) over the lines real runs write:
each crash and OOM line either engine prints fails the claim that watches for it, and the same
words anywhere else (a prompt, another program's line) do not."""

from __future__ import annotations

import re
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


def cases(window: str) -> list[str]:
    return sorted(p.stem for p in (acceptance_dir() / window / "cases").glob("*.toml"))


# cases whose lines are a log shipper's JSON records: a line of one is a whole record, which a
# prefix before it or an edit inside it would make a text line (what it then is), so they are
# left out where every line of every case is rewritten
SHIPPED = {"pass_fluent_bit_json"}


def rewritable(window: str) -> list[str]:
    return [c for c in cases(window) if c not in SHIPPED]


def expected(window: str, case: str) -> dict[str, str]:
    path = acceptance_dir() / window / "cases" / f"{case}.toml"
    return tomllib.loads(path.read_text(encoding="utf-8"))["expect"]["claims"]


def each_line(text: str, wrap) -> str:
    return "".join(wrap(x) + "\n" if x.strip() else "\n" for x in text.splitlines())


BAR0 = "Processed prompts:   0%|          | 0/64 [00:00<?, ?it/s]"
BAR = "Processed prompts:  50%|█████     | 32/64 [00:10<00:10, 3.20it/s, est. speed input: 400.00 toks/s]"
COLLECTORS = {  # how a whole log is collected: each line as the collector writes it
    "docker logs -t": lambda x: "2025-10-15T00:07:38.764529167Z " + x,
    "journald": lambda x: "Sep 22 23:46:42 gpu-node-3 server[361991]: " + x,
    "journalctl -o short-iso": lambda x: "2025-09-22T23:46:42+0000 gpu-node-3 server[361991]: " + x,
    "docker compose": lambda x: "server-1  | " + x,
    "Ray actor": lambda x: "(ServerActor pid=41820) " + x,
    "srun --label": lambda x: "0: " + x,
    "compose of docker -t": lambda x: "server-1  | 2025-10-15T00:07:38.764529167Z " + x,
    "after a progress bar": lambda x: BAR + x,
    "after carriage returns": lambda x: "\r" + BAR0 + "\r" + BAR + x,
}


@pytest.mark.parametrize("collector", COLLECTORS)
@pytest.mark.parametrize("window", ["sglang_pressure", "vllm_pressure"])
def test_every_case_collected_any_way_gets_its_verdicts(tmp_path, window, collector):
    # decoys stay decoys, crashes stay crashes, and runs stay PASS behind every outer layer
    wrap = COLLECTORS[collector]
    got = {
        c: verdicts(tmp_path, window, each_line(case_log(window, c), wrap))
        for c in rewritable(window)
    }
    assert got == {c: expected(window, c) for c in rewritable(window)}


SG_HEAD = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?: [A-Z][A-Z0-9 ]*)?\] (?!INFO: )")
SG_CONFIGS = {  # SGLang run with a logging config: its heads carry no rank tag
    "time, level, pid, file": lambda m: f"{m[1]} INFO 151972 [scheduler.py:1580] ",
    "time, [level], logger": lambda m: f"{m[1]},659 [INFO] sglang.srt.managers.scheduler: ",
}
# cases that tell apart scheduler groups by their rank tags, or predate the date in the head
SG_NEEDS_TAGS = {"pass_data_parallel", "fail_not_drained", "fail_oom_crash"}


@pytest.mark.parametrize("config", SG_CONFIGS)
def test_sglang_with_a_logging_config_gets_its_verdicts(tmp_path, config):
    head = SG_CONFIGS[config]
    for case in sorted(set(cases("sglang_pressure")) - SG_NEEDS_TAGS):
        text = each_line(case_log("sglang_pressure", case), lambda x: SG_HEAD.sub(head, x, count=1))
        assert verdicts(tmp_path, "sglang_pressure", text) == expected("sglang_pressure", case), (
            case
        )


V_HEAD = re.compile(
    r"(\([^()]*\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d) \[?(\w+)\.py:\d+\] "
)
V_MODULES = {
    "metrics": "vllm.engine.metrics",
    "scheduler": "vllm.core.scheduler",
    "launcher": "vllm.entrypoints.launcher",
    "loggers": "vllm.v1.metrics.loggers",
    "core": "vllm.v1.engine.core",
}


def v_logging_format(m: re.Match[str]) -> str:
    # '%(asctime)s - %(name)s - %(levelname)s - %(message)s', after vLLM's own process tag
    name = V_MODULES.get(m[4], f"vllm.{m[4]}")
    return f"{m[1] or ''}2025-{m[3]},123 - {name} - {m[2]} - "


def v_2024(line: str) -> str:
    # the 0.x engine's stats line as 2024 releases logged it: from llm_engine.py, and carrying
    # fields this window does not read (between the ones it reads, and after them)
    if "metrics.py:" not in line:
        return line
    line = line.replace("metrics.py:449]", "llm_engine.py:706]").replace(
        "metrics.py:467]", "llm_engine.py:706]"
    )
    line = line.replace(" reqs, Swapped:", " reqs, Running LoRA adapters: 0, Swapped:")
    return line.rstrip(".") + ", Max running adapters: 0"


VLLM_WRITES = {
    "a logging format of its own": lambda x: V_HEAD.sub(v_logging_format, x, count=1),
    "2024: the stats from llm_engine.py, with more fields": v_2024,
}


@pytest.mark.parametrize("writes", VLLM_WRITES)
def test_vllm_as_other_releases_and_logging_configs_write_it(tmp_path, writes):
    for case in rewritable("vllm_pressure"):
        text = each_line(case_log("vllm_pressure", case), VLLM_WRITES[writes])
        assert verdicts(tmp_path, "vllm_pressure", text) == expected("vllm_pressure", case), case
