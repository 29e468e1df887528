"""An `every` claim's window for a key closes at that key's terminal event (a request's finish,
abort or reject by default; `closes` in the spec names others) or at boot.stop: a key whose
window closed without its follow-up is a FAIL with the key and the seqs, whether or not the log
goes on to a boot.stop. Only a key still open where the log ends is UNDECIDED."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.parse import SpecError, parse_spec
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
