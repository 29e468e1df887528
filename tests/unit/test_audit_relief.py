"""relief_ladder judged on the shapes of the engine's own rung receipts: an engagement counts as
paid only where a rung paid what was asked (``relief.rung`` outcome ``paid``: the ladder stops
there), and a rung's outcome and numbers must agree with what it was asked and what it freed."""

from __future__ import annotations

from pathlib import Path

from audit.spec import resolve
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText


def paid_at_decode(
    log: LogText, asked: int = 16, paid: int = 16, freed: int | None = None
) -> LogText:
    """The evict rung at decode: its eviction receipt, then the rung's outcome."""
    log.r("relief.engage", shortfall=asked, rungs=3, site="decode")
    freed = paid if freed is None else freed
    log.r(
        "eviction",
        reason="decode",
        asked=asked,
        evicted=freed,
        staged=0,
        evictable_before=64,
        evictable_after=64 - freed,
        available_after=freed,
    )
    outcome = "paid" if paid >= asked else "short"
    return log.r(
        "relief.rung", rung="evict", asked=asked, paid=paid, outcome=outcome, site="decode"
    )


def asked_at_park(log: LogText) -> LogText:
    """The ladder re-asked for a parked chunk: the throttle and retraction pay nothing."""
    log.r("relief.engage", shortfall=16, rungs=2, site="park")
    log.r("relief.rung", rung="throttle", asked=16, paid=0, outcome="short", site="park")
    log.r("relief.throttle", iterations=8, until=log.iter + 8, running=1, waiting=3, site="park")
    return log.r("relief.rung", rung="retract", asked=16, paid=0, outcome="short", site="park")


def judge(tmp_path: Path, log: LogText, control: LogText):
    report = evaluate(
        [resolve("relief_ladder")],
        [log.write(tmp_path / "on.log")],
        control.write(tmp_path / "off.log"),
    )
    return report, {c.claim: c for c in report.specs[0].claims}


def control_with_parks(n: int) -> LogText:
    log = LogText("b-000000c0").ready()
    for i in range(n):
        log.received(f"r-{i}").park(f"r-{i}").r("admission.unpark", rid=f"r-{i}", tokens=32)
        log.finish(f"r-{i}")
    return log.stop()


def test_a_ladder_re_asked_for_a_parked_chunk_is_not_paid_by_the_asking(tmp_path):
    """8 engagements paid at decode; one chunk parked and the ladder re-asked 12 rounds, paying
    nothing: 8 of 20 paid, not 19 of 20 (engagements - parks)."""
    log = LogText().ready().received("r-0")
    for _ in range(8):
        paid_at_decode(log)
    log.park("r-0")
    for i in range(12):
        log.iter = i + 1
        asked_at_park(log)
    log.r("admission.unpark", rid="r-0", tokens=32).finish("r-0").stop()
    _, got = judge(tmp_path, log, control_with_parks(3))
    v = got["rungs_paid"]
    assert v.status.value == "FAIL", v.why
    assert v.numbers["paid"] == 8 and v.numbers["engagements"] == 20


def test_a_rung_that_says_paid_while_paying_less_than_asked_fails(tmp_path):
    log = LogText().ready()
    for _ in range(3):
        paid_at_decode(log)
    log.r("relief.engage", shortfall=32, rungs=3, site="decode")
    log.r(
        "eviction",
        reason="decode",
        asked=32,
        evicted=8,
        staged=0,
        evictable_before=8,
        evictable_after=0,
        available_after=8,
    )
    log.r("relief.rung", rung="evict", asked=32, paid=8, outcome="paid", site="decode").stop()
    report, got = judge(tmp_path, log, control_with_parks(2))
    assert report.status.value == "FAIL"
    failed = [c for c, v in got.items() if v.status.value == "FAIL"]
    assert failed == ["paid_rungs_met_the_ask"], {c: v.why for c, v in got.items()}


def test_a_rung_that_pays_more_than_its_eviction_freed_fails(tmp_path):
    log = LogText().ready()
    for _ in range(3):
        paid_at_decode(log)
    paid_at_decode(log, asked=16, paid=16, freed=0).stop()  # said 16, the eviction freed none
    report, got = judge(tmp_path, log, control_with_parks(2))
    assert report.status.value == "FAIL"
    v = got["rung_paid_what_it_freed"]
    assert v.status.value == "FAIL" and "paid == ev.evicted: 16 == 0" in v.why


def tiered(host: int = 4096) -> LogText:
    log = LogText().r("boot.start", config={})
    log.r("tier.sized", path="configured", host_kv_tokens=host, bytes_per_token=512, page_size=4)
    log.r("boot.ready", startup_s=0.1)
    for _ in range(3):
        paid_at_decode(log)
    return log


def spill(log: LogText, n: int) -> LogText:
    return log.r(
        "tier.spill", tokens=n, bytes=n * 512, seconds=0.001, nodes=1, dropped=0, host_free=4096 - n
    )


def load(log: LogText, n: int, rid: str = "r-1") -> LogText:
    return log.r("tier.load", tokens=n, bytes=n * 512, seconds=0.001, nodes=1, rid=rid, asked=n)


def test_a_load_of_tokens_never_spilled_fails(tmp_path):
    log = spill(tiered(), 32)
    load(log, 32)  # what was spilled: fine
    load(log, 64).stop()  # 64 tokens loaded from a host that was given 32
    report, got = judge(tmp_path, log, control_with_parks(2))
    v = got["host_loads_were_spilled"]
    assert v.status.value == "FAIL", v.why
    assert "tokens <= spilled - dropped: 64 <= 32 - 0" in v.why
    assert report.status.value == "FAIL"


def test_a_drop_of_more_than_the_host_held_fails(tmp_path):
    log = spill(tiered(), 32)
    log.r("tier.drop", reason="spill", tokens=48, nodes=2, need=48, host_free=4096).stop()
    _, got = judge(tmp_path, log, control_with_parks(2))
    v = got["host_drops_were_held"]
    assert v.status.value == "FAIL" and "48 <= 32 - 0" in v.why


def test_without_a_host_tier_the_host_claims_do_not_apply(tmp_path):
    log = LogText().r("boot.start", config={})
    log.r("tier.sized", path="off", host_kv_tokens=0, bytes_per_token=512, page_size=4, reason="x")
    log.r("boot.ready", startup_s=0.1)
    for _ in range(3):
        paid_at_decode(log)
    report, got = judge(tmp_path, log.stop(), control_with_parks(2))
    assert {
        c: got[c].status.value for c in ("host_loads_were_spilled", "host_drops_were_held")
    } == {
        "host_loads_were_spilled": "N/A",
        "host_drops_were_held": "N/A",
    }
    assert report.status.value == "PASS", {c: v.why for c, v in got.items()}
