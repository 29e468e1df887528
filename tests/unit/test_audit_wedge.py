"""The wedge signal by progress: where `iteration` receipts carry the progress counters, a wedge
is work waiting while nothing progressed (no counter rose, no admit, unpark, finish or abort) for
longer than the threshold, whatever the step time and however sparsely iterations are sampled.
Logs whose iterations lack the counters are judged by the older rule (see test_audit_claims)."""

from __future__ import annotations

import pytest

from tests.unit.audit_logs import LogText
from tests.unit.test_audit_claims import WEDGE, decide

BUSY = dict(parked=0, token_usage=0.9, running=1, waiting=2)


def counters(tokens: int, admissions: int = 3, ended: int = 1) -> dict:
    return dict(tokens_generated=tokens, admissions=admissions, requests_ended=ended)


def deferred(log: LogText, at: float, it: int) -> LogText:
    return log.r("admission.defer", ts=at, iter=it, count=2, reason="max_running", running=1)


def run(steps: list[tuple[str, float, int, dict]]) -> LogText:
    log = LogText().ready()
    t0 = log.ts
    for event, dt, it, fields in steps:
        if event == "defer":
            deferred(log, t0 + dt, it)
        elif event == "iteration":
            log.r("iteration", ts=t0 + dt, iter=it, **{**BUSY, **fields})
        else:
            log.r(event, ts=t0 + dt, iter=it, **fields)
    return log


SLOW = [  # 1 s steps under load, sampled every 50 steps; defers every step in between
    ("defer", 0.5, 1, {}),
    *(("defer", float(t), t, {}) for t in range(10, 50, 10)),
    ("iteration", 50, 50, counters(60)),
    *(("defer", float(t), t, {}) for t in range(60, 100, 10)),
    ("iteration", 100, 100, counters(110)),
]


def test_slow_steps_that_progress_are_no_wedge(tmp_path):
    v = decide(tmp_path, WEDGE, run(SLOW))  # the older rule saw 49.5 s of defers here
    assert (v.status, v.numbers["found"]) == ("PASS", 0), v.why


def test_work_waiting_while_the_counters_stand_still_is_a_wedge_even_with_requests_running(
    tmp_path,
):
    steps = [("iteration", t, t * 10, counters(40)) for t in (0, 20, 40, 60)]
    v = decide(tmp_path, WEDGE, run(steps))
    assert v.status == "FAIL", v.why
    assert "no progress for 40.0 s > 30 s while work waited" in v.why
    assert "tokens_generated 40, admissions 3, requests_ended 1" in v.why
    assert v.numbers["found"] == 1  # one span, reported once


def test_a_sampled_summary_cannot_hide_a_wedge_between_samples(tmp_path):
    # nothing ran between the samples: the second one, 45 s later, shows the same counters
    steps = [
        ("iteration", 0, 50, counters(40)),
        ("defer", 10, 51, {}),
        ("defer", 30, 70, {}),
        ("iteration", 45, 100, {**counters(40), "running": 0}),
    ]
    assert decide(tmp_path, WEDGE, run(steps)).status == "FAIL"


@pytest.mark.parametrize(
    ("steps", "status"),
    [
        # a progress receipt between the samples: an admission
        (
            [
                ("iteration", 0, 50, counters(40)),
                ("admission.admit", 20, 60, dict(rid="r-1", tokens=4)),
                ("iteration", 45, 100, counters(40, admissions=4)),
            ],
            "PASS",
        ),
        # a request aborted between steps is progress: the span starts over (none is left)
        (
            [
                ("iteration", 0, 50, counters(40)),
                ("request.abort", 20, 50, dict(rid="r-1", reason="client_disconnect")),
                ("boot.stop", 45, 50, dict(reason="sigterm", in_flight=1)),
            ],
            "PASS",
        ),
        # no step ran after the sample and the engine was stopped 60 s later: nothing progressed
        (
            [
                ("iteration", 0, 50, counters(40)),
                ("boot.stop", 60, 50, dict(reason="sigterm", in_flight=2)),
            ],
            "FAIL",
        ),
        # one step ran after the sample and took 60 s: a slow step, not proof of a wedge
        (
            [
                ("iteration", 0, 50, counters(40)),
                ("boot.stop", 60, 51, dict(reason="sigterm", in_flight=2)),
            ],
            "PASS",
        ),
        # nothing waited at the second sample: the span ends there
        (
            [
                ("iteration", 0, 50, counters(40)),
                ("iteration", 20, 100, {**counters(40), "waiting": 0}),
                ("iteration", 45, 150, counters(40)),
            ],
            "PASS",
        ),
        # just under the threshold
        ([("iteration", 0, 50, counters(40)), ("iteration", 29.9, 100, counters(40))], "PASS"),
    ],
)
def test_progress_is_a_counter_rising_or_a_progress_receipt(tmp_path, steps, status):
    v = decide(tmp_path, WEDGE, run(steps))
    assert v.status == status, v.why


def test_each_rank_is_judged_by_what_its_own_iterations_carry(tmp_path):
    log = run(SLOW)  # rank 0 carries counters: its slow steps are fine
    t0 = log.ts
    log.ready(rank=1)  # rank 1 is an older engine: deferred 40 s with nothing scheduled
    log.r("admission.defer", 1, ts=t0 + 1, count=1, reason="budget")
    log.r("iteration", 1, ts=t0 + 41, running=0, waiting=1, parked=0)
    v = decide(tmp_path, WEDGE, log)
    assert v.status == "FAIL" and "rank 1" in v.why and "no tokens scheduled" in v.why, v.why


def test_each_boot_is_judged_apart(tmp_path):
    # b-1 waits and says nothing more; b-2, booted 100 s later into the same file, is idle:
    # b-2's receipts measure nothing of b-1's wait
    log = deferred(LogText("b-1").ready(), 1000.5, 1)
    log.boot = "b-2"
    log.r("boot.start", ts=1100.0, config={}).r("boot.ready", ts=1100.1, startup_s=0.1)
    assert decide(tmp_path, WEDGE, log).status == "PASS"
    log.boot = "b-1"
    log.r("iteration", ts=1101.0, iter=2, **BUSY)  # b-1 again, 100 s on: that is a wedge
    v = decide(tmp_path, WEDGE, log)
    assert v.status == "FAIL" and "boot b-1" in v.why, v.why


def stood(seconds: float, arrived: int = 0, **held) -> LogText:
    """A loop that stood still for ``seconds`` (no receipt in between, as a stopped process
    writes none), holding ``held``, then turned again."""
    fields = {**dict(running=0, waiting=0, parked=0), **held}
    steps = [
        ("iteration", 0, 1, counters(10)),
        ("scheduler.stall", seconds, 2, dict(since=0.0, limit_s=10, **fields)),
        ("scheduler.resume", seconds, 2, dict(stalled_s=seconds, arrived=arrived)),
        ("iteration", seconds + 1, 3, counters(12)),
    ]
    return run(steps)


@pytest.mark.parametrize(
    "held",
    [dict(running=2), dict(waiting=1), dict(parked=1), dict(arrived=3)],
    ids=["running", "waiting", "parked", "arrived-while-it-stood"],
)
def test_a_stall_past_the_threshold_holding_work_is_a_wedge(tmp_path, held):
    v = decide(tmp_path, WEDGE, stood(35.0, **held))
    assert (v.status, v.numbers["found"]) == ("FAIL", 1), v.why
    assert "the scheduler stood still for 35.0 s > 30 s holding work" in v.why
    assert "from scheduler.stall" in v.why and "to scheduler.resume" in v.why


@pytest.mark.parametrize(
    ("seconds", "held"),
    [(35.0, {}), (20.0, dict(running=2, arrived=1))],
    ids=["idle", "short"],
)
def test_a_stall_that_held_nothing_or_was_short_is_no_wedge(tmp_path, seconds, held):
    v = decide(tmp_path, WEDGE, stood(seconds, **held))
    assert (v.status, v.numbers["found"]) == ("PASS", 0), v.why
