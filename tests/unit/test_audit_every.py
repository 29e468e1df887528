"""An `every` claim's window for a key closes at that key's terminal event (a request's finish,
abort or reject by default; `closes` in the spec names others) or at boot.stop: a key whose
window closed without its follow-up is a FAIL with the key and the seqs, whether or not the log
goes on to a boot.stop. Only a key still open where the log ends is UNDECIDED."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from audit.checker import Bus
from audit.followups import KEPT
from audit.kinds import build_checker
from audit.parse import SpecError, parse_spec
from audit.reader import scan
from audit.verdict import evaluate, receivers
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
    other = parse(
        'kind = "every"\nwhen = { kind = "eviction" }\nthen = { kind = "eviction" }\n'
        'key = "reason"\n'
    ).claims[0]
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
    v = decide(tmp_path, either, log)  # three windows: r-1's first closed, followed, at 6
    assert v.status == "FAIL" and v.numbers["keys"] == 3 and v.numbers["failed"] == 2, v.why
    assert "r-1 (rank 0): when at seq 7" in v.why


def test_claims_reading_one_kind_by_different_keys_each_get_their_own(tmp_path):
    by_rid = (
        'kind = "every"\nwhen = { kind = "request.received" }\nthen = { kind = "request.finish" }\n'
    )
    by_trace = by_rid + 'key = "trace_id"\n'
    spec = parse_spec(
        'description = "t"\n[[claim]]\nid = "rid"\n'
        + by_rid
        + '[[claim]]\nid = "trace"\n'
        + by_trace,
        Path("t/spec.toml"),
    )
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


def test_a_follow_up_after_the_window_closed_does_not_follow_it(tmp_path):
    # the park ended with the request (finish closes it); the unpark after it is too late
    parked = (
        'kind = "every"\nwhen = { kind = "admission.park" }\nthen = { kind = "admission.unpark" }\n'
    )
    log = LogText().ready().received("r-1").park("r-1").finish("r-1")  # seq 3, 4, 5
    log.r("admission.unpark", rid="r-1", tokens=4).stop()  # seq 6
    v = decide(tmp_path, parked, log)
    assert v.status == "FAIL", v.why
    assert "admission.park at seq 4, its window closed at seq 5" in v.why


def read_windows(path: Path, claim: str, *, exact: bool = False):
    """The `every` checker of ``claim`` after reading ``path``, and the bus's reading state."""
    bus = Bus(exact=exact)
    checker = build_checker(parse(claim).claims[0], bus)
    scan([path], on_text=bus.text, routes=receivers(bus))
    return checker


def test_what_the_windows_hold_is_the_windows_open_not_the_log(tmp_path):
    log = LogText().ready()
    for n in range(400):  # four hundred requests, two in flight at a time
        log.received(f"r-{n}")
        if n:
            log.finish(f"r-{n - 1}")
    windows = read_windows(log.write(tmp_path / "a.log"), ENDS).windows
    assert windows.held() == 1 and windows.windows == 399
    assert windows.ranks[("b-00000001", 0)].open.keys() == {"r-399"}
    exact = read_windows(tmp_path / "a.log", ENDS, exact=True).windows
    # kept to be sorted: each received, and each finish twice (it follows and it closes)
    assert exact.held() == 0 and len(exact.seen[("b-00000001", 0)]) == 400 + 2 * 399
    exact.replay()
    assert exact.held() == 1 and exact.windows == 399 and not exact.seen


def test_many_failed_windows_are_counted_all_and_named_the_first_by_sort_order(tmp_path):
    n = 3 * KEPT * 4  # more than the failures kept by name, in no order
    rids = [f"r-{k}" for k in range(1000, 1000 + n)]
    random.Random(7).shuffle(rids)
    log = LogText().ready()
    for rid in rids:  # each abort closes a window that the finish (`then`) never followed
        log.received(rid).r("request.abort", rid=rid, reason="client_disconnect")
    v = decide(tmp_path, ENDS, log.stop())
    names = sorted(f"{rid} (rank 0)" for rid in rids)
    assert v.status == "FAIL" and v.numbers["failed"] == n and v.numbers["keys"] == n, v.why
    assert v.numbers["failed_keys"] == names[:50]
    shown = ", ".join(names[:5])
    assert f"{shown} and {n - 5} more" in v.why
    at = 3 + 2 * rids.index("r-1000")
    assert (
        f"first: r-1000 (rank 0): request.received at seq {at}, its window closed at seq {at + 1}"
        in v.why
    )


def test_a_log_read_out_of_order_is_read_again_in_seq_order(tmp_path):
    log = LogText().ready().received("r-1").finish("r-1").stop()  # seq 3, 4, 5
    lines = str(log).splitlines(keepends=True)
    first, second = tmp_path / "1.log", tmp_path / "2.log"
    first.write_text("".join(lines[:3]))
    second.write_text("".join(lines[3:]))  # the finish and the stop, read first below
    ahead = read_windows(second, ENDS)
    assert not ahead.rescan(None)
    for order in ([first, second], [second, first]):
        v = evaluate([parse(ENDS)], order).specs[0].claims[0]
        assert v.status == "PASS" and v.numbers["keys"] == 1, (order, v.why)


def test_a_record_that_opens_a_window_does_not_follow_it(tmp_path):
    again = 'kind = "every"\nwhen = { kind = "eviction" }\nthen = { kind = "eviction" }\nkey = "reason"\n'
    ev = {
        "reason": "pool",
        "asked": 4,
        "evicted": 4,
        "staged": 0,
        "evictable_before": 8,
        "evictable_after": 4,
    }
    log = LogText().ready().r("eviction", **ev).stop()
    v = decide(tmp_path, again, log)
    assert v.status == "FAIL" and "eviction at seq 3, boot.stop at seq 4" in v.why, v.why


def test_a_window_followed_twice_counts_under_the_first_then_of_the_spec(tmp_path):
    tally = (
        'kind = "every"\nwhen = { kind = "admission.park" }\ntally = true\n'
        'then = [{ kind = "admission.unpark" }, { kind = "requeue" }]\n'
    )
    log = LogText().ready().received("r-1").park("r-1").r("requeue", rid="r-1")
    log.r("admission.unpark", rid="r-1", tokens=4).finish("r-1").received("r-2").park("r-2")
    log.r("requeue", rid="r-2").r("admission.unpark", rid="r-2", tokens=4)  # not closed yet
    v = decide(tmp_path, tally, log)
    assert v.status == "PASS" and v.numbers["closed_by"] == {"admission.unpark": 2, "requeue": 0}


def test_a_live_window_judges_the_windows_read_the_exact_way(tmp_path):
    log = LogText().ready().received("r-1").finish("r-1").received("r-2")
    v = evaluate([parse(ENDS)], [log.write(tmp_path / "a.log")], live=True).specs[0].claims[0]
    assert v.status == "UNDECIDED" and v.numbers["open_keys"] == ["r-2 (rank 0)"], v.why
    assert (v.numbers["keys"], v.numbers["failed"], v.numbers["open"]) == (2, 0, 1)


def test_a_when_again_before_the_window_closed_opens_it_again_from_there(tmp_path):
    parked = (
        'kind = "every"\nwhen = { kind = "admission.park" }\nthen = { kind = "admission.unpark" }\n'
    )
    log = LogText().ready().received("r-1").park("r-1").r("admission.unpark", rid="r-1", tokens=4)
    log.park("r-1").finish("r-1").stop()  # parked again at seq 6, never unparked: ended at 7
    v = decide(tmp_path, parked, log)
    assert v.status == "FAIL" and v.numbers["keys"] == 1, v.why
    assert "admission.park at seq 6, its window closed at seq 7" in v.why
