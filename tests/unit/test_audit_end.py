"""How a boot ended: a log cut with requests in flight cannot decide a claim that needs the end
(`needs_end`: UNDECIDED, in_flight_at_end); a boot.stop for any reason but an orderly one is a
crash (boot_health FAIL), and a boot that failed before it served is one, named with its cause;
a seq the engine never writes is its own reason (seq_invalid)."""

from __future__ import annotations

import pytest

from audit.parse import SpecError
from audit.reader import scan
from audit.spec import resolve
from audit.verdict import evaluate
from engine.observability import schema
from tests.unit.audit_logs import LogText
from tests.unit.test_audit_claims import NEVER, decide
from tests.unit.test_audit_every import parse

ENDS = NEVER + "needs_end = true\n"


def test_a_claim_that_needs_the_end_is_undecided_on_a_log_cut_with_requests_in_flight(tmp_path):
    cut = LogText().ready().received("r-1").received("r-2").finish("r-1")
    v = decide(tmp_path, ENDS, cut)
    assert (v.status, v.reason) == ("UNDECIDED", "in_flight_at_end"), v.why
    assert "1 request(s) received without an ending" in v.why and "rank 0" in v.why
    assert decide(tmp_path, NEVER, cut).status == "PASS"  # a claim that does not need it
    assert decide(tmp_path, ENDS, cut.stop()).status == "PASS"  # the boot ended
    idle = LogText().ready().received("r-1").finish("r-1")  # cut, but nothing in flight
    assert decide(tmp_path, ENDS, idle).status == "PASS"


def test_in_flight_is_judged_per_rank(tmp_path):
    log = LogText().ready(0).ready(1).received("r-1", 0).received("r-1", 1).finish("r-1", 0)
    log.stop(0)  # rank 0 ended in order; rank 1 still has r-1 open and no boot.stop
    v = decide(tmp_path, ENDS, log)
    assert v.reason == "in_flight_at_end" and "rank 1" in v.why, v.why


def test_needs_end_is_a_boolean_of_never_claims():
    assert parse(ENDS).claims[0].needs_end is True
    with pytest.raises(SpecError, match="needs_end is true or false"):
        parse(NEVER + 'needs_end = "yes"\n')
    with pytest.raises(SpecError, match="unknown key"):
        parse('kind = "engaged"\nselect = { kind = "boot.ready" }\nneeds_end = true\n')


def boot_health(tmp_path, log: LogText) -> dict[str, tuple[str, str | None]]:
    report = evaluate([resolve("boot_health")], [log.write(tmp_path / "boot.log")])
    return {c.claim: (c.status.value, c.reason) for c in report.specs[0].claims}


def test_boot_health_over_a_cut_log_with_work_in_flight_is_undecided(tmp_path):
    got = boot_health(tmp_path, LogText().ready().received("r-1"))
    assert got["stopped_in_order"] == ("UNDECIDED", "in_flight_at_end")
    assert got.pop("no_store_set_aside") == ("N/A", "not_applicable")  # no store was opened
    assert {v[0] for v in got.values()} == {"PASS", "UNDECIDED"}


@pytest.mark.parametrize("reason", ["scheduler_died", "group_split", "oom_killed", ""])
def test_boot_health_fails_a_boot_that_stopped_for_any_but_an_orderly_reason(tmp_path, reason):
    log = LogText().ready().received("r-1")
    log.r("boot.stop", reason=reason, in_flight=1)
    status, _ = boot_health(tmp_path, log)["stopped_in_order"]
    assert status == "FAIL"


@pytest.mark.parametrize("reason", schema.ORDERLY_STOPS)
def test_boot_health_passes_every_orderly_stop(tmp_path, reason):
    log = LogText().ready().received("r-1").r("request.abort", rid="r-1", reason=reason)
    log.r("boot.stop", reason=reason, in_flight=1)
    assert boot_health(tmp_path, log)["stopped_in_order"] == ("PASS", None)


def boot_health_whys(tmp_path, log: LogText) -> dict[str, tuple[str, str]]:
    report = evaluate([resolve("boot_health")], [log.write(tmp_path / "boot.log")])
    return {c.claim: (c.status.value, c.why) for c in report.specs[0].claims}


def test_a_boot_that_failed_before_serving_fails_boot_health_naming_its_cause(tmp_path):
    log = LogText().r("boot.start", config={"tp": 3})  # never ready: it exited while booting
    error = "engine failed to start: ValueError: tp 3 does not divide the model's 4 attention heads"
    log.r("boot.stop", reason=schema.BOOT_FAILED, in_flight=0, exit_code=2, error=error)
    got = boot_health_whys(tmp_path, log)
    status, why = got["stopped_in_order"]
    assert status == "FAIL"
    assert f"reason 'boot_failed', exit_code 2, error {error!r}" in why
    assert got["ready"][0] == "UNDECIDED"  # a boot that never served says nothing of serving
    assert schema.BOOT_FAILED not in schema.ORDERLY_STOPS


def test_a_boot_that_only_began_stays_undecided(tmp_path):
    got = boot_health(tmp_path, LogText().r("boot.start", config={}))  # it may be booting still
    assert got.pop("no_store_set_aside")[0] == "N/A"  # it opened no store (yet): out of the verdict
    assert {v for v, _ in got.values()} == {"UNDECIDED"}


def test_a_crash_names_what_its_stop_says_of_the_cause(tmp_path):
    log = LogText().ready().received("r-1").r("request.abort", rid="r-1", reason="scheduler_died")
    log.r("boot.stop", reason="scheduler_died", in_flight=1, signal="SIGKILL", exit_code=-9)
    _, why = boot_health_whys(tmp_path, log)["stopped_in_order"]
    assert why.endswith("reason 'scheduler_died', exit_code -9, signal 'SIGKILL'")


def test_the_spec_names_exactly_the_orderly_stops_of_the_schema():
    claim = next(c for c in resolve("boot_health").claims if c.id == "stopped_in_order")
    (pred,) = claim.select[0].where
    assert (pred.field, pred.op) == ("reason", "not_in")
    assert sorted(pred.value) == sorted(schema.ORDERLY_STOPS)


@pytest.mark.parametrize("seq", [0, -3, "5", 2.5, None, True])
def test_a_seq_the_engine_never_writes_is_seq_invalid_not_a_duplicate(tmp_path, seq):
    log = LogText().ready().received("r-1").received("r-2")
    shown = "null" if seq is None else repr(seq).replace("'", '"').replace("True", "true")
    log.lines[2] = log.lines[2].replace('"seq":3', f'"seq":{shown}')  # r-1's receipt
    stats = scan([log.write(tmp_path / "a.log")])
    evaluated = type(seq) is int  # a receipt below 1 is still read; one that is not an int is not
    got = (stats.receipts, stats.seq_invalid, stats.foreign_json)
    assert got == ((4, 0, 0) if evaluated else (3, 1, 0))
    reason, why = stats.incomplete()  # seq 3 is missing too: the invalid seq is named first
    assert reason == "seq_invalid", why
    assert "seen twice" not in why and "1 receipt(s)" in why and "rank 0" in why


def test_a_receipt_read_twice_is_still_a_duplicate(tmp_path):
    whole = LogText().ready().write(tmp_path / "a.log")
    assert scan([whole, whole]).incomplete()[0] == "seq_duplicate"


def test_an_aborted_request_is_not_in_flight(tmp_path):
    log = LogText().ready().received("r-1").received("r-2").finish("r-1")
    log.r("request.abort", rid="r-2", reason="client_disconnect")  # cut here: nothing open
    assert decide(tmp_path, ENDS, log).status == "PASS"
