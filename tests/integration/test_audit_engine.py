"""The auditor on boot logs written by the real engine (tiny model, in-process)."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from engine import LLM, SamplingParams
from engine.observability import schema
from engine.scheduler.ledger import ledger_violations
from tests.faults import drop_request
from tests.integration.test_pressure import three_at_once, workload


def read(log) -> list[dict]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines()]


def pressured_log(model: str, log, n: int = 32) -> None:
    """A pressured run with the relief ladder off: admission's floor (parks) is what pays."""
    prompts, params = workload(300, n=n)
    llm = LLM(
        model=model,
        kv_tokens=three_at_once(prompts, params),
        chunk_tokens=32,
        max_running=8,
        check_invariants=True,
        log_file=str(log),
        iteration_receipt_interval=5,
        relief_ladder=False,
    )
    llm.generate(prompts, params)
    llm.close("test")


@pytest.fixture(scope="module")
def pressured(tiny_model_dir, tmp_path_factory):
    """One pressured run's boot log, shared by the tests that only read it."""
    log = tmp_path_factory.mktemp("pressured") / "boot.jsonl"
    pressured_log(tiny_model_dir, log)
    return log


def test_the_catalog_knows_every_field_a_pressured_engine_writes(pressured):
    recs = read(pressured)
    kinds = {r["event"] for r in recs}
    assert {"admission.park", "retract", "requeue", "eviction", "iteration"} <= kinds
    unknown = {
        (r["event"], f)
        for r in recs
        if r["event"] != schema.INVARIANT_VIOLATION  # its numbers depend on what failed
        for f in r
        if not schema.known_field(r["event"], f)
    }
    assert unknown == set()


def test_a_dropped_request_loses_a_request_without_an_ending_and_keeps_the_ledger(
    tiny_model_dir, tmp_path
):
    log = tmp_path / "boot.jsonl"
    llm = LLM(model=tiny_model_dir, kv_tokens=2048, log_file=str(log), check_invariants=True)
    sched = llm.core.scheduler
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    reqs = [sched.add_request([3, 4, 5, 6], params) for _ in range(3)]
    sched.step()
    drop_request(sched, reqs[1].rid)
    while sched.has_work():
        sched.step()  # check mode: the ledger and request states are checked every step
    llm.close("test")
    ends = [r["rid"] for r in read(log) if r["event"] in ("request.finish", "request.abort")]
    assert sorted(ends) == sorted([reqs[0].rid, reqs[2].rid])
    assert ledger_violations(llm.core.allocator, sched.cache, private=0) == []  # all handed back


def audit_log(log, *windows: str) -> dict[str, dict[str, tuple[str, str | None, str]]]:
    from audit.spec import resolve
    from audit.verdict import evaluate

    report = evaluate([resolve(w) for w in windows], [log])
    return {
        s.spec: {c.claim: (c.status.value, c.reason, c.why) for c in s.claims} for s in report.specs
    }


def overall(verdicts: dict[str, tuple[str, str | None, str]]) -> str:
    from audit.status import Status, merge

    return merge([Status(v[0]) for v in verdicts.values()]).value


def test_a_pressured_run_passes_admission_park_and_no_request_lost(pressured):
    got = audit_log(
        pressured, "admission_park", "no_request_lost", "boot_health", "eviction_honesty"
    )
    for window in ("admission_park", "no_request_lost", "boot_health", "eviction_honesty"):
        assert overall(got[window]) == "PASS", got[window]
    # the pressure really engaged: parks seen, retractions followed (not vacuous)
    assert got["admission_park"]["parks_seen"][1] is None
    assert got["no_request_lost"]["every_retract_requeued"][1] is None
    assert got["no_request_lost"]["every_request_ends"][2] == (
        "all 32 rids from request.received later had request.finish | request.abort"
    )


def test_an_unpressured_run_is_undecided_on_admission_park_and_passes_no_request_lost(
    tiny_model_dir, tmp_path
):
    log = tmp_path / "boot.jsonl"
    prompts, params = workload(300, n=4)
    llm = LLM(model=tiny_model_dir, kv_tokens=16384, log_file=str(log), check_invariants=True)
    llm.generate(prompts, params)
    llm.close("test")
    got = audit_log(log, "admission_park", "no_request_lost")
    assert overall(got["admission_park"]) == "UNDECIDED"
    assert got["admission_park"]["parks_seen"][:2] == ("UNDECIDED", "no_engagement")
    assert overall(got["no_request_lost"]) == "PASS"


def test_a_dropped_request_fails_no_request_lost_naming_the_rid(tiny_model_dir, tmp_path):
    log = tmp_path / "boot.jsonl"
    llm = LLM(model=tiny_model_dir, kv_tokens=2048, log_file=str(log), check_invariants=True)
    sched = llm.core.scheduler
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    reqs = [sched.add_request([3, 4, 5, 6], params) for _ in range(4)]
    sched.step()
    drop_request(sched, reqs[2].rid)
    while sched.has_work():
        sched.step()
    unstopped = audit_log(log, "no_request_lost")["no_request_lost"]["every_request_ends"]
    assert unstopped[:2] == ("UNDECIDED", "in_flight_at_end")  # no boot.stop yet: maybe running
    llm.close("test")
    status, reason, why = audit_log(log, "no_request_lost")["no_request_lost"]["every_request_ends"]
    assert status == "FAIL", why
    assert f"{reqs[2].rid} (rank 0)" in why and "1 of 4" in why
    for other in (reqs[0], reqs[1], reqs[3]):
        assert f"{other.rid} (rank" not in why


PROGRESS = ("tokens_generated", "admissions", "requests_ended")


def test_iteration_receipts_carry_progress_counted_since_boot(pressured):
    """The wedge claim reads progress from these: cumulative, so a sampled receipt still shows
    what every step in between did."""
    recs = read(pressured)
    before: Counter[str] = Counter()
    last = (0, 0, 0)
    for r in recs:  # one rank, one file: the lines are in seq order
        if r["event"] == schema.ITERATION:
            got = tuple(r[f] for f in PROGRESS)
            ended = before[schema.REQUEST_FINISH] + before[schema.REQUEST_ABORT]
            assert got[1:] == (before[schema.ADMISSION_ADMIT], ended), r
            assert got >= last and got[0] >= last[0], (last, got)
            last = got
        before[r["event"]] += 1
    finished = [r for r in recs if r["event"] == schema.REQUEST_FINISH]
    assert 0 < last[0] <= sum(r["tokens"] for r in finished)


def test_tokens_generated_counts_every_sampled_token(tiny_model_dir, tmp_path):
    prompts, params = workload(300, n=8)
    llm = LLM(model=tiny_model_dir, kv_tokens=16384, log_file=str(tmp_path / "b.jsonl"))
    outs = llm.generate(prompts, params)
    snap = llm.core.scheduler.snapshot()
    assert snap.tokens_generated == sum(len(o.token_ids) for o in outs)
    assert snap.progress() == {
        "tokens_generated": snap.tokens_generated,
        "admissions": snap.receipts["admission.admit"],
        "requests_ended": snap.receipts["request.finish"],
    }
    llm.close()


def test_boot_health_reads_how_the_real_engine_stopped(tiny_model_dir, tmp_path):
    def stopped_in_order(log) -> tuple[str, str | None]:
        return audit_log(log, "boot_health")["boot_health"]["stopped_in_order"][:2]

    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for reason, verdict in ((None, ("PASS", None)), ("scheduler_died", ("FAIL", None))):
        log = tmp_path / f"{reason}.jsonl"
        llm = LLM(model=tiny_model_dir, kv_tokens=2048, log_file=str(log))
        llm.core.scheduler.add_request([3, 4, 5, 6], params)
        llm.core.scheduler.step()
        assert stopped_in_order(log) == ("UNDECIDED", "in_flight_at_end")  # running, no stop
        llm.close() if reason is None else llm.close(reason)  # None: LLM.close's own default
        assert stopped_in_order(log) == verdict
