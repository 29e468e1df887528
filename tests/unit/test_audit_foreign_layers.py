"""Foreign engines' lines as operators collect them: a collector's prefix, a launcher's process
tag or a progress bar before the engine's own head is stripped (in layers, any of them stacked),
and each engine's heads include the shapes its logging configs write. A line is an event only
where, once the outer layers are gone, the engine's own head starts it: a layer is never a head.
Every line here has the shape of one a real run wrote."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from audit.checker import Bus
from audit.foreign import FORMATS, Matcher
from audit.model import TextEvent


def event(name: str, fmt: str, regex: str, *loggers: str) -> TextEvent:
    pattern = re.compile(regex)
    pins = loggers or None
    return TextEvent(name, fmt, pattern, pins, FORMATS[fmt].fields | set(pattern.groupindex))


RETRACT = event(
    "retract",
    "sglang",
    r"KV cache pool is full\. Retract requests\. #retracted_reqs: (?P<retracted>\d+)(?:, .*)?",
)
STATS = event("stats", "vllm", r"Avg prompt .* Pending: (?P<waiting>\d+) reqs, .*", "metrics.py")
V1 = event(
    "v1", "vllm", r"Engine \d+: Avg prompt .* Waiting: (?P<waiting>\d+) reqs, .*", "loggers.py"
)
EVENTS = [RETRACT, STATS, V1]

SG_MSG = "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.3150 -> 0.5000"
SG_LINE = "[2025-01-01 12:00:13 DP1 TP1] " + SG_MSG
V_MSG = (
    "Avg prompt throughput: 812.3 tokens/s, Avg generation throughput: 41.7 tokens/s, Running: 16 "
    "reqs, Swapped: 0 reqs, Pending: 48 reqs, GPU KV cache usage: 99.2%, CPU KV cache usage: 0.0%."
)
V_LINE = "INFO 01-22 18:27:15 metrics.py:449] " + V_MSG
V1_MSG = (
    "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 5.4 tokens/s, "
    "Running: 1 reqs, Waiting: 14 reqs, GPU KV cache usage: 76.5%, Prefix cache hit rate: 92.0%"
)
BAR = (
    "Processed prompts:  50%|█████     | 32/64 [00:10<00:10, 3.20it/s, est. speed input: 400.00 "
    "toks/s, output: 50.00 toks/s]"
)


def found(line: str) -> list[tuple[str, dict]]:
    return [(ev.name, f) for ev, f in Matcher(EVENTS).read(line)[1]]


COLLECTED = [
    (
        "docker logs -t",
        "2025-10-15T00:07:38.764529167Z (APIServer pid=1) INFO 10-15 00:07:38 [loggers.py:123] "
        + V1_MSG,
        "v1",
        {"proc": "APIServer pid=1", "waiting": 14},
    ),
    (
        "journald",
        "Sep 22 23:46:42 gpu-node-3 vllm[361991]: INFO 09-22 23:46:42 [metrics.py:449] " + V_MSG,
        "stats",
        {"proc": "", "waiting": 48, "time": "09-22 23:46:42"},
    ),
    (
        "journalctl -o short-iso",
        "2025-09-22T23:46:42+0000 gpu-node-3 vllm[361991]: " + V_LINE,
        "stats",
        {},
    ),
    (
        "docker compose",
        "vllm-1  | ERROR 01-02 03:04:05 [metrics.py:449] " + V_MSG,
        "stats",
        {"level": "ERROR"},
    ),
    ("docker compose v1", "sglang_1     | " + SG_LINE, "retract", {"proc": "DP1 TP1"}),
    (
        "Ray actor",
        "(SGLangEngine pid=41820) " + SG_LINE,
        "retract",
        {"group": "DP1", "retracted": 3},
    ),
    (
        "Ray worker with its ip",
        "(RayWorkerWrapper pid=2211, ip=10.0.0.2) " + SG_LINE,
        "retract",
        {},
    ),
    (
        "Ray actor, vLLM's head reads the tag",
        "(_AsyncLLMEngine pid=1974) " + V_LINE,
        "stats",
        {"proc": "_AsyncLLMEngine pid=1974"},
    ),
    ("SkyPilot task", "(task, pid=17415) " + SG_LINE, "retract", {}),
    ("srun --label", "0: " + V_LINE, "stats", {}),
    (
        "stacked: compose, docker time, Ray",
        "sglang-1  | 2025-10-15T00:07:38.764529167Z (SGLangEngine pid=41820) " + SG_LINE,
        "retract",
        {"proc": "DP1 TP1"},
    ),
    (
        "glued after a progress bar",
        BAR + "INFO 01-02 03:04:05 [metrics.py:449] " + V_MSG,
        "stats",
        {},
    ),
    (
        "after carriage returns",
        "\rProcessed prompts:   0%|          | 0/64 [00:00<?, ?it/s]\r" + BAR + SG_LINE,
        "retract",
        {},
    ),
    (
        "what a console shows after a carriage return",
        "Loading weights: 3/4\r" + SG_LINE,
        "retract",
        {},
    ),
    (
        "GitHub Actions",
        "2024-05-01T12:34:56.1234567Z INFO 01-22 18:27:15 [metrics.py:449] " + V_MSG,
        "stats",
        {"waiting": 48},
    ),
    (
        "GitLab CI, job log timestamps",
        "2024-05-30T14:30:00.123456Z 00O  " + SG_LINE,
        "retract",
        {"proc": "DP1 TP1"},
    ),
    (
        "GitLab CI, stderr, a continued line",
        "2024-05-30T14:30:00.123456Z 0aE+ " + V_LINE,
        "stats",
        {},
    ),
    (
        "Kubernetes container log file (CRI)",
        "2025-01-22T18:27:15.731100201Z stderr F " + V_LINE,
        "stats",
        {"waiting": 48},
    ),
    (
        "kubectl logs --timestamps",
        "2025-01-22T18:27:15.731100201Z " + SG_LINE,
        "retract",
        {"retracted": 3},
    ),
    (
        "Loki's logcli, labels padded",
        '2025-01-22T18:27:15Z {container="vllm", pod="vllm-0"}   ' + V_LINE,
        "stats",
        {},
    ),
    ("logcli, every label common", "2025-01-22T18:27:15+01:00 {} " + SG_LINE, "retract", {}),
    ("Buildkite", "[2025-03-10T15:07:20Z] " + V_LINE, "stats", {}),
    (
        "stacked: compose, then a CRI line",
        "vllm-1  | 2025-01-22T18:27:15.731100201Z stdout F " + V_LINE,
        "stats",
        {},
    ),
    # the heads of logs run with a logging config
    (
        "SGLang: time, level, pid, file",
        "2025-12-04 20:35:53 INFO 151972 [scheduler.py:1580] " + SG_MSG,
        "retract",
        {"time": "2025-12-04 20:35:53", "proc": "", "group": ""},
    ),
    (
        "SGLang: time, [level], logger",
        "2026-06-07 10:59:31,659 [WARNING] sglang.srt.managers.scheduler: " + SG_MSG,
        "retract",
        {"time": "2026-06-07 10:59:31,659"},
    ),
    (
        "SGLang with SGLANG_LOG_MS",
        "[2025-01-01 12:00:13.123 TP0] " + SG_MSG,
        "retract",
        {"time": "2025-01-01 12:00:13.123"},
    ),
    (
        "vLLM: Python logging's '%(asctime)s - %(name)s - %(levelname)s - %(message)s'",
        "2025-03-01 10:00:00,123 - vllm.engine.metrics - INFO - " + V_MSG,
        "stats",
        {"logger": "vllm.engine.metrics", "level": "INFO", "time": "2025-03-01 10:00:00,123"},
    ),
    (
        "the same from a tagged process",
        "(EngineCore_DP0 pid=7) 2025-03-01 10:00:00,123 - vllm.v1.metrics.loggers - INFO - "
        + V1_MSG,
        "v1",
        {"proc": "EngineCore_DP0 pid=7"},
    ),
]


@pytest.mark.parametrize(
    ("how", "line", "name", "expect"), COLLECTED, ids=[c[0] for c in COLLECTED]
)
def test_a_collected_line_is_its_engines_event(how, line, name, expect):
    [(got, fields)] = found(line)
    assert got == name
    assert {k: fields[k] for k in expect} == expect


def test_what_text_selectors_see_is_the_line_without_its_outer_layers():
    read = Matcher([]).read  # a window with whole-line selectors only
    assert (
        read("vllm-1  | Traceback (most recent call last):")[0]
        == "Traceback (most recent call last):"
    )
    assert read("Sep 22 23:46:42 gpu-3 sglang[7]: Killed")[0] == "Killed"
    assert read(BAR + "Killed")[0] == "Killed"
    assert (
        Matcher(EVENTS).read("vllm-1  | " + V_LINE)[0] == V_LINE
    )  # the head stays: it is the line
    bus, seen = Bus(), []
    for source in ("text", "json"):
        bus.texts[source].append(lambda line, where: seen.append(line))
    bus.text("text", "\x1b[36msglang-1  |\x1b[0m Fatal Python error: Aborted", "a.log:1")
    bus.text("json", 'x  | {"msg": 1}', "a.log:2")  # a foreign JSON line is left as it is
    assert seen == ["Fatal Python error: Aborted", 'x  | {"msg": 1}']


NOT_EVENTS = [
    "vllm-1  | " + V_MSG,  # a layer is not a head: the words bare behind it
    "(SGLangEngine pid=41820) " + SG_MSG,
    BAR + SG_MSG,
    "Sep 22 23:46:42 gpu-3 bench[9]: client got: " + SG_LINE,
    "2025-03-01 10:00:00,123 - mybench - INFO - " + V_MSG,  # a logger that is not vllm's
    "2025-03-01 10:00:00,123 - vllm.engine.metrics - INFO - prompt: '" + V_MSG + "'",
    "2026-06-07 10:59:31,659 [INFO] mysglang.retry: " + SG_MSG,  # a logger that is not sglang's
    "2025-01-01 12:00:12,004 INFO tail: " + SG_MSG,
    "2025-01-01 12:00:12 INFO tail: " + SG_MSG,
    "sglang-1  | [2025-01-01 12:00:11 TP0] Receive: obj=GenerateReqInput(text='" + SG_MSG + "')",
    "INFO 01-22 18:27:15 mybench.metrics.py:12] " + V_MSG,  # the module is mybench.metrics
    "2024-05-30T14:30:00.123456Z 00O  " + V_MSG,  # a CI's prefix is a layer, not a head
    "2025-01-22T18:27:15.731100201Z stdout F " + SG_MSG,
    '2025-01-22T18:27:15Z {container="bench"} client got: ' + SG_LINE,
    "[2025-03-10T15:07:20Z] " + V_MSG,
]


@pytest.mark.parametrize("line", NOT_EVENTS)
def test_the_words_behind_anything_but_the_engines_head_are_not_an_event(line):
    assert found(line) == []


@given(st.text(min_size=1))
def test_nothing_but_outer_layers_before_the_head_makes_an_event(junk):
    for line in (SG_LINE, V_LINE):
        starts = any(h.match(junk + line) for f in FORMATS.values() for h in f.heads)
        if not starts and Matcher([]).read(junk)[0] != "":  # junk that is not layers alone
            assert found(junk + line) == [], junk
