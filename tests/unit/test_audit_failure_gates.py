"""A failure the log shows is never hidden by an engagement gate: a claim whose FAIL is in hand
is a FAIL though what it ``requires`` was never seen (an engine that died before its first
stats line), and a window over an engine's text log is judged by ``audit verdict`` without
``--spec`` though its regime was never seen, where one of its claims FAILs on lines in that
engine's own head. Only an incomplete log still holds a FAIL back where the FAIL rests on a
line not being there (a lost line might be the one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.parse import parse_spec
from audit.spec import resolve
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText
from tests.unit.test_audit_across import CLAIM as ACROSS
from tests.unit.test_audit_across import boots
from tests.unit.test_audit_prior import HOST, drop, load, spill
from tests.unit.test_audit_ranks import DIGESTS, rank_log

UNSEEN = 'requires = { kind = "relief.engage" }\n'  # a kind none of these logs holds

EVERY = 'kind = "every"\nwhen = { kind = "request.received" }\nthen = { kind = "request.finish" }\n'
FINAL = 'kind = "final"\nselect = { kind = "boot.ready" }\ncheck = "startup_s < 0.05"\n'


def decide(tmp_path: Path, claim: str, *logs: LogText):
    spec = parse_spec('description = "t"\n[[claim]]\nid = "c"\n' + claim, Path("t/spec.toml"))
    paths = [log.write(tmp_path / f"rank-{i}.jsonl") for i, log in enumerate(logs)]
    return evaluate([spec], paths).specs[0].claims[0]


def unfinished() -> LogText:  # r-1 received, the boot stopped without finishing it
    return LogText().ready().received("r-1").stop()


def too_slow() -> LogText:  # boot.ready says 0.1 s, the claim wants under 0.05 s; then stopped
    return LogText().ready().stop()


def overdrawn() -> LogText:  # a load of more than was ever spilled and not dropped
    log = spill(LogText().ready(), 32)
    drop(log, 32)
    return load(log, 16).stop()


CASES = [
    ("every", EVERY, lambda: [unfinished()]),
    ("final", FINAL, lambda: [too_slow()]),
    ("prior", HOST, lambda: [overdrawn()]),
    ("across_boots", ACROSS, lambda: list(boots(found=False))),
    ("ranks_agree", DIGESTS, lambda: [rank_log(0), rank_log(1, change={2: [("r-1", 9)]})]),
]


@pytest.mark.parametrize(("kind", "claim", "logs"), CASES, ids=[c[0] for c in CASES])
def test_a_failure_in_hand_is_a_fail_though_what_the_claim_requires_is_unseen(
    tmp_path, kind, claim, logs
):
    assert decide(tmp_path, claim, *logs()).status == "FAIL"  # as ever
    v = decide(tmp_path, claim + UNSEEN, *logs())
    assert v.status == "FAIL", f"{kind}: {v.status} ({v.reason}): {v.why}"


@pytest.mark.parametrize(("kind", "claim", "logs"), CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_without_a_failure_what_the_claim_requires_still_gates(tmp_path, kind, claim, logs):
    passing = LogText().ready().received("r-1").finish("r-1").stop()
    quick = LogText().ready().stop()
    quick.lines[1] = quick.lines[1].replace('"startup_s":0.1', '"startup_s":0.01')
    log = passing if kind == "every" else quick
    assert decide(tmp_path, claim, log).status == "PASS"
    v = decide(tmp_path, claim + UNSEEN, log)
    assert (v.status, v.reason) == ("UNDECIDED", "no_engagement"), v.why


def test_a_failure_that_rests_on_a_missing_line_waits_for_a_complete_log(tmp_path):
    log = LogText().ready().received("r-1")
    log.r("request.finish", rid="r-1", reason="length", tokens=3, lose=True)  # a lost line
    v = decide(tmp_path, EVERY + UNSEEN, log.stop())
    assert (v.status, v.reason) == ("UNDECIDED", "seq_gap"), v.why


V1_DIED = (
    "(EngineCore_DP0 pid=7) INFO 04-28 22:54:30 [core.py:70] Initializing a V1 LLM engine\n"
    "(EngineCore_DP0 pid=7) ERROR 04-28 22:54:32 [core.py:700] EngineCore encountered a fatal "
    "error.\n"
)
SGLANG_DIED = (
    "[2025-03-29 18:18:34 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    "AssertionError: unsupported layout\n"
)
SOMEONE_ELSES = "Traceback (most recent call last):\nValueError: bad input\nKilled\n"


def picked(tmp_path: Path, text: str) -> dict[str, str]:
    """What ``audit verdict`` without ``--spec`` judges of a log: window -> overall verdict."""
    log = tmp_path / "x.log"
    log.write_text(text, encoding="utf-8")
    specs = [resolve("vllm_pressure"), resolve("sglang_pressure")]
    report = evaluate(specs, [log], only_applicable=True)
    return {s.spec: s.status.value for s in report.specs}


def test_an_engine_that_died_before_its_first_stats_line_is_judged_without_spec(tmp_path):
    assert picked(tmp_path, V1_DIED) == {"vllm_pressure": "FAIL"}
    assert picked(tmp_path, SGLANG_DIED) == {"sglang_pressure": "FAIL"}


def test_a_crash_in_no_engines_words_makes_no_window_apply(tmp_path):
    assert picked(tmp_path, SOMEONE_ELSES) == {}
    # nor does a failure in one engine's words make the other engine's window apply
    assert "sglang_pressure" not in picked(tmp_path, V1_DIED + SOMEONE_ELSES)


PREEMPTED_THEN_STOPPED = (  # vLLM 0.x: a preemption, then the server stopped before any stats line
    "WARNING 01-22 18:27:16 scheduler.py:1560] Sequence group cmpl-1-0 is preempted by "
    "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect "
    "the end-to-end performance. total_num_cumulative_preemption=1\n"
    "INFO 01-22 18:27:18 launcher.py:57] Shutting down FastAPI HTTP server.\n"
)


def test_a_follow_up_missing_in_the_engines_own_lines_is_judged_without_spec(tmp_path):
    assert picked(tmp_path, PREEMPTED_THEN_STOPPED) == {"vllm_pressure": "FAIL"}
