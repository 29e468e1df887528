"""Each claim kind decides PASS, FAIL and UNDECIDED from small hand-made logs, with the numbers
in its sentence; the gates (incomplete log, no engagement, vacuous opt-in) hold for every kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.parse import parse_spec
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText


def decide(tmp_path: Path, claim: str, log: LogText, control: LogText | None = None):
    spec = parse_spec('description = "t"\n[[claim]]\nid = "c"\n' + claim, Path("t/spec.toml"))
    c = None if control is None else control.write(tmp_path / "control.log")
    report = evaluate([spec], [log.write(tmp_path / "boot.log")], c)
    return report.specs[0].claims[0]


ENGAGED = 'kind = "engaged"\nselect = { kind = "admission.park" }\nmin = 2\n'


def test_engaged_needs_min_matches_else_undecided_no_engagement(tmp_path):
    v = decide(tmp_path, ENGAGED, LogText().ready().park("r-1").park("r-2"))
    assert v.status == "PASS" and v.numbers["seen"] == 2
    v = decide(tmp_path, ENGAGED, LogText().ready().park("r-1"))
    assert (v.status, v.reason) == ("UNDECIDED", "no_engagement")
    assert "1 admission.park seen, 2 needed" in v.why


def test_vacuous_pass_only_where_the_claim_allows_it(tmp_path):
    quiet = LogText().ready()
    assert decide(tmp_path, ENGAGED, quiet).status == "UNDECIDED"
    v = decide(tmp_path, ENGAGED + "allow_vacuous = true\n", quiet)
    assert (v.status, v.reason) == ("PASS", "vacuous")
    every = 'kind = "every"\nwhen = { kind = "retract" }\nwhen_key = "rids"\nthen = { kind = "requeue" }\n'
    assert decide(tmp_path, every, quiet.stop()).reason == "no_engagement"
    assert decide(tmp_path, every + "allow_vacuous = true\n", quiet).reason == "vacuous"


NEVER = 'kind = "never"\nselect = { kind = "alloc.oom" }\nrequires = { kind = "boot.ready" }\n'


def test_never_fails_on_a_seen_signature_even_in_an_incomplete_log(tmp_path):
    log = LogText().ready().r("notice", lose=True, text="x")
    log.r("alloc.oom", need=16, available=0, rid="r-9")
    v = decide(tmp_path, NEVER, log)
    assert v.status == "FAIL" and "rid r-9" in v.why and "seq 4" in v.why


def test_never_is_undecided_on_a_seq_gap_and_without_its_requirement(tmp_path):
    v = decide(tmp_path, NEVER, LogText().ready().r("notice", lose=True, text="x").stop())
    assert (v.status, v.reason) == ("UNDECIDED", "seq_gap")
    assert "lacks 1 (first missing seq 3)" in v.why
    v = decide(tmp_path, NEVER, LogText().r("boot.start", config={}))
    assert (v.status, v.reason) == ("UNDECIDED", "no_engagement")
    assert decide(tmp_path, NEVER, LogText().ready()).status == "PASS"


EVERY = (
    'kind = "every"\nwhen = { kind = "request.received" }\n'
    'then = [{ kind = "request.finish" }, { kind = "request.abort" }]\n'
)


def test_every_open_request_is_fail_after_boot_stop_and_undecided_before(tmp_path):
    log = LogText().ready().received("r-1").received("r-2").finish("r-1")
    v = decide(tmp_path, EVERY, log)
    assert (v.status, v.reason) == ("UNDECIDED", "in_flight_at_end") and "r-2" in v.why
    v = decide(tmp_path, EVERY, log.stop())
    assert v.status == "FAIL" and "r-2 (rank 0)" in v.why and "r-1" not in v.why
    assert v.numbers == {"keys": 2, "failed": 1, "open": 0, "failed_keys": ["r-2 (rank 0)"]}


def test_every_means_later_by_seq_on_the_same_rank(tmp_path):
    # r-1 finished on rank 1 only; on rank 0 it was received after its only finish
    log = LogText().ready(0).ready(1).finish("r-1", 0).received("r-1", 0).received("r-1", 1)
    log.finish("r-1", 1).stop(0).stop(1)
    v = decide(tmp_path, EVERY, log)
    assert v.status == "FAIL" and "r-1 (rank 0)" in v.why and "rank 1" not in v.why
    retracted_twice = LogText().ready().received("r-1")
    retracted_twice.r("retract", rids=["r-1"], tokens_freed=3).r("requeue", rid="r-1")
    retracted_twice.r("retract", rids=["r-1"], tokens_freed=3).stop()
    v = decide(
        tmp_path,
        'kind = "every"\nwhen = { kind = "retract" }\nwhen_key = "rids"\nthen = { kind = "requeue" }\n',
        retracted_twice,
    )
    assert v.status == "FAIL"  # the second retraction was never requeued


RATIO = (
    'kind = "ratio"\ncount = { engagements = { kind = "relief.engage" }, '
    'parks = { kind = "admission.park" } }\nlet = { rungs_paid = "engagements - parks" }\n'
    'numerator = "rungs_paid"\ndenominator = "engagements"\nmin = 0.5\nname = "paid_share"\n'
)


def ladder(engages: int, parks: int) -> LogText:
    log = LogText().ready()
    for _ in range(engages):
        log.r("relief.engage", shortfall=8)
    for i in range(parks):
        log.park(f"r-{i}")
    return log


def test_ratio_shows_its_arithmetic_and_is_undecided_on_a_zero_denominator(tmp_path):
    v = decide(tmp_path, RATIO, ladder(7, 2))
    assert v.status == "PASS"
    assert "rungs_paid = engagements - parks = 7 - 2 = 5" in v.why
    assert "paid_share = rungs_paid / engagements = 5 / 7 = 0.714, needed >= 0.5" in v.why
    v = decide(tmp_path, RATIO, ladder(4, 3))
    assert v.status == "FAIL" and "= 1 / 4 = 0.25" in v.why
    v = decide(tmp_path, RATIO, ladder(0, 3))
    assert (v.status, v.reason) == ("UNDECIDED", "zero_denominator")


def test_a_derived_number_over_a_zero_denominator_is_undecided(tmp_path):
    claim = (
        'kind = "compare"\ncount = { engagements = { kind = "relief.engage" }, '
        'parks = { kind = "admission.park" } }\nlet = { share = "parks / engagements" }\n'
        'check = "share <= 1"\n'
    )
    v = decide(tmp_path, claim, ladder(0, 3))
    assert (v.status, v.reason) == ("UNDECIDED", "zero_denominator")
    assert "a denominator is zero (counts)" in v.why
    assert decide(tmp_path, claim, ladder(4, 2)).status == "PASS"


def test_compare_with_sums(tmp_path):
    claim = (
        'kind = "compare"\nsum = { evicted = { select = { kind = "eviction" }, field = "evicted" }, '
        'asked = { select = { kind = "eviction" }, field = "asked" } }\ncheck = "evicted >= asked"\n'
    )
    log = LogText().ready()
    ev = dict(reason="decode", staged=0, evictable_before=50, evictable_after=40)
    log.r("eviction", asked=10, evicted=12, **ev).r("eviction", asked=10, evicted=9, **ev)
    v = decide(tmp_path, claim, log)
    assert v.status == "PASS" and "evicted >= asked: 21 >= 20 holds" in v.why
    log.r("eviction", asked=5, evicted=0, **ev)
    assert decide(tmp_path, claim, log).status == "FAIL"
    assert decide(tmp_path, claim, LogText().ready()).reason == "no_engagement"


CONTROL = (
    'kind = "control"\ncount = { parks = { kind = "admission.park" } }\n'
    'check = "parks <= control.parks"\ncontrol_engaged = "parks"\n'
)


def test_control_claims(tmp_path):
    v = decide(tmp_path, CONTROL, ladder(1, 2))
    assert (v.status, v.reason) == ("UNDECIDED", "no_control")
    assert "no control log was given" in v.why
    v = decide(tmp_path, CONTROL, ladder(1, 2), control=ladder(0, 0))
    assert (v.status, v.reason) == ("UNDECIDED", "control_not_engaged")
    v = decide(tmp_path, CONTROL, ladder(1, 2), control=ladder(0, 5))
    assert v.status == "PASS" and "parks <= control.parks: 2 <= 5 holds" in v.why
    assert decide(tmp_path, CONTROL, ladder(1, 6), control=ladder(0, 5)).status == "FAIL"
    gap = ladder(0, 5).r("notice", lose=True, text="x").r("notice", text="y")
    v = decide(tmp_path, CONTROL, ladder(1, 2), control=gap)
    assert (v.status, v.reason) == ("UNDECIDED", "control_seq_gap")


INVARIANT = (
    'kind = "invariant"\nselect = { kind = "eviction" }\n'
    'check = "evicted >= min(asked, evictable_before)"\n'
)


def test_invariant_names_the_first_receipt_that_breaks_it(tmp_path):
    log = LogText().ready()
    log.r(
        "eviction",
        reason="d",
        asked=10,
        evicted=12,
        staged=0,
        evictable_before=50,
        evictable_after=38,
    )
    assert decide(tmp_path, INVARIANT, log).status == "PASS"
    log.r(
        "eviction", reason="d", asked=10, evicted=3, staged=0, evictable_before=5, evictable_after=2
    )
    v = decide(tmp_path, INVARIANT, log)
    assert v.status == "FAIL"
    assert "seq 4" in v.why and "3 >= min(10, 5)" in v.why
    assert decide(tmp_path, INVARIANT, LogText().ready()).reason == "no_engagement"
    nulls = LogText().ready()
    nulls.r(
        "eviction",
        reason="d",
        asked=None,
        evicted=3,
        staged=0,
        evictable_before=5,
        evictable_after=2,
    )
    assert decide(tmp_path, INVARIANT, nulls).reason == "missing_field"


AGREE = (
    'kind = "ranks_agree"\nselect = [{ kind = "admission.admit" }, { kind = "admission.park" }]\n'
    'fields = ["rid"]\n'
)


def two_ranks(rank1_parks: str = "r-2", lose: bool = False) -> LogText:
    log = LogText().ready(0).ready(1)
    log.iter = 1
    log.r("admission.admit", 1, rid="r-1", tokens=4).r("admission.admit", 0, rid="r-1", tokens=4)
    log.park("r-2", 0).park(rank1_parks, 1)
    log.iter = 2
    log.r("notice", 0, text="x").r("notice", 1, text="x", lose=lose).r("notice", 1, text="y")
    return log


def test_ranks_agree(tmp_path):
    v = decide(tmp_path, AGREE, two_ranks())
    assert v.status == "PASS" and v.numbers["iterations"] == 1
    v = decide(tmp_path, AGREE, two_ranks(rank1_parks="r-3"))
    assert v.status == "FAIL" and "iter 1" in v.why
    assert decide(tmp_path, AGREE, two_ranks(lose=True)).reason == "seq_gap"
    single = LogText().ready().park("r-1")
    assert decide(tmp_path, AGREE, single).reason == "single_rank"
    assert decide(tmp_path, AGREE + "allow_vacuous = true\n", single).reason == "vacuous"


WEDGE = (
    'kind = "never"\nselect = { signal = "wedge", threshold_s = 30 }\n'
    'requires = { kind = "boot.ready" }\n'
)
ITER = dict(parked=0, token_usage=1.0)


@pytest.mark.parametrize(
    ("steps", "status"),
    [
        # deferred at t=0, an iteration 45 s later still with nothing running: a wedge
        ([("admission.defer", 0, {}), ("iteration", 45, dict(running=0, waiting=2))], "FAIL"),
        # the same span with decodes running in between: no wedge
        (
            [
                ("admission.defer", 0, {}),
                ("iteration", 20, dict(running=1, waiting=2)),
                ("iteration", 45, dict(running=0, waiting=2)),
            ],
            "PASS",
        ),
        # waiting 29 s then admitted: under the threshold
        ([("admission.defer", 0, {}), ("admission.admit", 29, dict(rid="r-1", tokens=4))], "PASS"),
        # admitted after 1 s, then a quiet minute with nothing held back: the wait had ended
        (
            [
                ("admission.defer", 0, {}),
                ("admission.admit", 1, dict(rid="r-1", tokens=4)),
                (
                    "eviction",
                    60,
                    dict(
                        reason="decode",
                        asked=1,
                        evicted=1,
                        staged=0,
                        evictable_before=1,
                        evictable_after=0,
                    ),
                ),
            ],
            "PASS",
        ),
        # an engine that hung silently and was stopped 60 s later
        (
            [
                ("admission.park", 0, dict(rid="r-1", reason="below_page", need=4, fundable=0)),
                ("boot.stop", 60, dict(reason="sigterm", in_flight=1)),
            ],
            "FAIL",
        ),
    ],
)
def test_wedge_is_work_waiting_without_tokens_scheduled_past_the_threshold(tmp_path, steps, status):
    log = LogText().ready()
    t0 = log.ts
    for event, dt, fields in steps:
        if event == "admission.defer":
            fields = dict(count=2, reason="budget")
        if event == "iteration":
            fields = {**ITER, **fields}
        log.r(event, ts=t0 + dt, **fields)
    v = decide(tmp_path, WEDGE, log)
    assert v.status == status, v.why
    if status == "FAIL":
        assert "> 30 s with no tokens scheduled" in v.why
