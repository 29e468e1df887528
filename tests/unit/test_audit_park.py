"""admission_park's every_park_resolves: a park is closed explicitly, by the receipts the
engine writes where a parked request leaves that state: funded again (admission.unpark), sent
back in line (retract, then requeue), or ended while parked (request.abort: the engine writes no
park-specific receipt then, so the abort closes it, and the verdict counts those). A parked
request is never in a forward, so it cannot finish without one of these first."""

from __future__ import annotations

from pathlib import Path

from audit.spec import resolve
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText


def verdict(tmp_path: Path, log: LogText):
    report = evaluate([resolve("admission_park")], [log.write(tmp_path / "b.log")])
    return next(c for c in report.specs[0].claims if c.claim == "every_park_resolves")


def test_a_park_ended_by_a_finish_with_no_unpark_fails(tmp_path):
    log = LogText().ready().received("r-1").park("r-1").finish("r-1").stop()
    v = verdict(tmp_path, log)
    assert v.status.value == "FAIL", v.why
    assert (
        "r-1 (rank 0)" in v.why and "admission.park at seq 4, its window closed at seq 5" in v.why
    )


def test_each_park_is_counted_under_what_closed_it(tmp_path):
    log = LogText().ready()
    for rid in ("r-1", "r-2", "r-3", "r-4"):
        log.received(rid)
    log.park("r-1").r("admission.unpark", rid="r-1", tokens=32).finish("r-1")
    log.park("r-2").r("retract", rids=["r-2"], tokens_freed=8, site="cutover")
    log.r("requeue", rid="r-2", generated=0).r("admission.admit", rid="r-2", tokens=40)
    log.finish("r-2")  # re-admitted from the line: not an unpark, and not a park left open
    log.park("r-3").r("request.abort", rid="r-3", reason="client_disconnect")  # ended parked
    log.park("r-4").r("admission.unpark", rid="r-4", tokens=32)
    log.r("request.abort", rid="r-4", reason="sigterm").stop()  # unparked first: counted so
    v = verdict(tmp_path, log)
    assert v.status.value == "PASS", v.why
    assert v.numbers["closed_by"] == {"admission.unpark": 2, "requeue": 1, "request.abort": 1}
    assert "2 by admission.unpark, 1 by requeue, 1 by request.abort" in v.why
