"""An `every` claim's window for a key closes at that key's terminal event (a request's finish,
abort or reject by default; `closes` in the spec names others) or at boot.stop: a key whose
window closed without its follow-up is a FAIL with the key and the seqs, whether or not the log
goes on to a boot.stop. Only a key still open where the log ends is UNDECIDED."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.parse import SpecError, parse_spec
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText
from tests.unit.test_audit_claims import decide

REQUEUED = (
    'kind = "every"\nwhen = { kind = "retract" }\nwhen_key = "rids"\n'
    'then = { kind = "requeue" }\nthen_key = "rid"\n'
)


def retracted(rid: str, log: LogText) -> LogText:
    return log.r("retract", rids=[rid], tokens_freed=3)


def test_a_retract_whose_request_ended_without_a_requeue_fails_without_boot_stop(tmp_path):
    log = LogText().ready().received("r-1").received("r-2")
    retracted("r-1", log).r("requeue", rid="r-1").finish("r-1")  # seq 5, 6, 7
    retracted("r-2", log).finish("r-2")  # seq 8, 9: ended, never requeued
    v = decide(tmp_path, REQUEUED, log)  # no boot.stop: the log is cut
    assert v.status == "FAIL", v.why
    assert "r-2 (rank 0)" in v.why and "r-1 (rank" not in v.why
    assert "retract at seq 8, its window closed at seq 9" in v.why
    assert v.numbers["failed"] == 1 and v.numbers["open"] == 0


def test_a_retract_still_open_where_the_log_ends_is_undecided(tmp_path):
    log = retracted("r-1", LogText().ready().received("r-1"))
    v = decide(tmp_path, REQUEUED, log)
    assert (v.status, v.reason) == ("UNDECIDED", "in_flight_at_end"), v.why
    v = decide(tmp_path, REQUEUED, log.stop())  # boot.stop closes every window
    assert v.status == "FAIL" and "boot.stop at seq" in v.why


def test_a_close_before_the_when_does_not_close_it(tmp_path):
    # r-1's finish has a lower seq than its retract: that life ended before; this one is open
    log = LogText().ready().received("r-1").finish("r-1")
    log = retracted("r-1", log.received("r-1"))
    assert decide(tmp_path, REQUEUED, log).reason == "in_flight_at_end"


def test_an_ending_that_is_also_the_follow_up_passes(tmp_path):
    ends = (
        'kind = "every"\nwhen = { kind = "request.received" }\n'
        'then = [{ kind = "request.finish" }, { kind = "request.abort" }]\n'
    )
    log = LogText().ready().received("r-1").finish("r-1")
    assert decide(tmp_path, ends, log).status == "PASS"


def test_closes_named_in_the_spec_replace_the_default(tmp_path):
    unparked = (
        'kind = "every"\nwhen = { kind = "admission.park" }\nthen = { kind = "admission.unpark" }\n'
        'closes = { kind = "request.abort" }\n'
    )
    log = LogText().ready().received("r-1").park("r-1")
    log.r("request.abort", rid="r-1", reason="client_disconnect")
    v = decide(tmp_path, unparked, log)
    assert v.status == "FAIL" and "r-1 (rank 0)" in v.why
    finished = LogText().ready().received("r-1").park("r-1").finish("r-1")
    assert decide(tmp_path, unparked, finished).reason == "in_flight_at_end"  # not a close here
    no_closes = REQUEUED + "closes = []\n"  # only boot.stop closes: as before closes existed
    log = retracted("r-1", LogText().ready().received("r-1")).finish("r-1")
    assert decide(tmp_path, no_closes, log).reason == "in_flight_at_end"


def parse(claim: str):
    return parse_spec('description = "t"\n[[claim]]\nid = "c"\n' + claim, Path("t/spec.toml"))


def test_request_keys_close_at_a_request_ending_by_default_other_keys_only_at_boot_stop():
    claim = parse(REQUEUED).claims[0]
    assert claim.close_key == "rid"
    assert [s.kind for s in claim.closes] == ["request.finish", "request.abort", "request.reject"]
    other = parse('kind = "every"\nwhen = { kind = "eviction" }\nthen = { kind = "eviction" }\n'
                  'key = "reason"\n').claims[0]  # fmt: skip
    assert other.closes == ()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('closes = { kind = "boot.ready" }\n', "receipt kind 'boot.ready' has no field 'rid'"),
        ('closes = { source = "text", regex = "x" }\n', "must name a receipt kind"),
        ('closes = { kind = "request.finish" }\nclose_key = "nope"\n', "has no field 'nope'"),
    ],
)
def test_bad_closes_are_spec_errors(extra, message):
    with pytest.raises(SpecError, match=message):
        parse(REQUEUED + extra)


ENDS = 'kind = "every"\nwhen = { kind = "request.received" }\nthen = { kind = "request.finish" }\n'


def twice_retracted() -> LogText:  # requeued the first time, ended without one the second
    log = retracted("r-1", LogText().ready().received("r-1")).r("requeue", rid="r-1")  # seq 5
    return retracted("r-1", log).finish("r-1")  # seq 6, 7


def twice_received() -> LogText:  # a rid used again: finished the first time, not the second
    return LogText().ready().received("r-1").finish("r-1").received("r-1").stop()  # seq 3..6


@pytest.mark.parametrize(
    ("claim", "log", "split", "why"),
    [
        (REQUEUED, twice_retracted, 5, "retract at seq 6, its window closed at seq 7"),
        (ENDS, twice_received, 4, "request.received at seq 5, boot.stop at seq 6"),
    ],
    ids=["a list key", "a scalar key"],
)
def test_a_window_is_judged_by_seq_whatever_order_the_files_are_read_in(
    tmp_path, claim, log, split, why
):
    lines = str(log()).splitlines(keepends=True)
    first, second = tmp_path / "1.log", tmp_path / "2.log"
    first.write_text("".join(lines[:split]))
    second.write_text("".join(lines[split:]))
    spec = parse(claim)
    for order in ([first, second], [second, first]):  # rotated files given newest first
        v = evaluate([spec], order).specs[0].claims[0]
        assert v.status == "FAIL" and why in v.why, v.why


def test_a_window_opens_at_the_latest_when_of_any_of_its_selectors(tmp_path):
    either = (
        'kind = "every"\nwhen = [{ kind = "admission.park" }, { kind = "admission.unpark" }]\n'
        'then = { kind = "request.finish" }\n'
    )
    log = LogText().ready().received("r-1").received("r-2").park("r-1").finish("r-1")
    log.r("admission.unpark", rid="r-1", tokens=4).r("admission.unpark", rid="r-2", tokens=4)
    log.stop()  # r-1: parked (5), finished (6), unparked (7); r-2 only unparked (8)
    v = decide(tmp_path, either, log)
    assert v.status == "FAIL" and v.numbers["keys"] == 2 and v.numbers["failed"] == 2, v.why
    assert "r-1 (rank 0): when at seq 7" in v.why


def test_claims_reading_one_kind_by_different_keys_each_get_their_own(tmp_path):
    by_rid = (
        'kind = "every"\nwhen = { kind = "request.received" }\nthen = { kind = "request.finish" }\n'
    )
    by_trace = by_rid + 'key = "trace_id"\n'
    spec = parse_spec(
        'description = "t"\n[[claim]]\nid = "rid"\n' + by_rid
        + '[[claim]]\nid = "trace"\n' + by_trace, Path("t/spec.toml")
    )  # fmt: skip
    log = LogText().ready().received("r-1", trace_id="t-1").received("r-2", trace_id="t-2")
    log.finish("r-1", trace_id="t-1").finish("r-2", trace_id="t-9").stop()
    rid, trace = evaluate([spec], [log.write(tmp_path / "a.log")]).specs[0].claims
    assert rid.status == "PASS", rid.why
    assert trace.status == "FAIL" and trace.numbers["failed"] == 1, trace.why
    assert "t-2 (rank 0)" in trace.why


def test_two_boots_in_one_log_are_judged_apart(tmp_path):
    # an engine run twice into one file: each boot's rank 0 has its own r-1
    log = LogText("b-1").ready().received("r-1").finish("r-1").stop()
    log.boot = "b-2"
    log.ready().received("r-1").stop()  # this r-1 never ended
    v = decide(tmp_path, ENDS, log)
    assert v.status == "FAIL" and v.numbers["keys"] == 2 and v.numbers["failed"] == 1, v.why
    assert "request.received at seq 3, boot.stop at seq 4" in v.why
