"""The wedge detector's compiled steps (``audit/fastwedge.c``) against ``audit.wedge``'s own feed,
receipt for receipt: the same wedges, the same state on every rank, the same errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit import native, wedge
from engine.observability import schema

pytestmark = pytest.mark.skipif(
    native.fast_feeder() is None, reason=f"not compiled: {native.why_not()}"
)

KINDS = (
    schema.ADMISSION_DEFER,
    schema.ADMISSION_PARK,
    schema.ADMISSION_ADMIT,
    schema.REQUEST_FINISH,
    schema.REQUEST_ABORT,
    schema.ITERATION,
    schema.EVICTION,
    schema.BOOT_STOP,
    schema.SCHEDULER_STALL,
    schema.SCHEDULER_RESUME,
    "request.received",
)
odd_times = st.sampled_from([None, True, "12", 7])  # missing, a bool, not a number, an int


@st.composite
def receipts(draw) -> list[dict[str, Any]]:
    out, ts = [], 1000.0
    counters = [0] * len(schema.PROGRESS)
    for _ in range(draw(st.integers(0, 50))):
        ts += draw(st.sampled_from([0.0, 0.5, 2.5, 12.0, 30.0, 31.0, 0.25]))  # on the threshold too
        rec: dict[str, Any] = {
            "event": draw(st.sampled_from(KINDS)),
            "boot": draw(st.sampled_from(["b1", "b1", "b1", "b2"])),
            "rank": draw(st.sampled_from([0, 0, 0, 1])),
            "ts": ts if draw(st.integers(0, 12)) else draw(odd_times),
            "iter": draw(st.integers(0, 3)),
        }
        if rec["ts"] is None:
            del rec["ts"]
        for f in ("waiting", "parked", "running", "stalled_s", "arrived"):
            if draw(st.booleans()):
                rec[f] = draw(st.sampled_from([0, 1, 2, 40.0]))
        if rec["event"] == schema.ITERATION and draw(st.booleans()):  # a counted rank's
            counters[draw(st.integers(0, len(counters) - 1))] += draw(st.integers(0, 1))
            rec.update(zip(schema.PROGRESS, counters))
        if draw(st.integers(0, 40)) == 0:
            del rec[draw(st.sampled_from(["boot", "rank", "event"]))]
        out.append(rec)
    return out


def fed(fn, recs: list[dict[str, Any]]) -> list[str]:
    raised = []
    for rec in recs:
        try:
            fn(rec)
        except Exception as e:  # noqa: BLE001 (both ways must raise alike)
            raised.append(type(e).__name__)
    return raised


def state(d: wedge.WedgeDetector) -> Any:
    ranks = {at: [getattr(r, s) for s in wedge._Rank.__slots__] for at, r in d.ranks.items()}
    return d.found(), ranks, d._last[:2]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=receipts(), threshold=st.sampled_from([30, 30.0, 2.5]))
def test_any_receipts_are_fed_as_the_python_rule_feeds_them(recs, threshold):
    compiled, python = wedge.WedgeDetector(threshold), wedge.WedgeDetector(threshold)
    fn = compiled.receiver()
    assert type(fn).__name__ == "builtin_function_or_method"
    assert fed(fn, recs) == fed(python.feed, recs)
    assert state(compiled) == state(python)


@pytest.mark.parametrize("gap", [30.0, 30.25, 39.0])
@pytest.mark.parametrize("threshold", [30, 30.0])
def test_a_span_held_past_the_threshold_is_a_wedge_the_compiled_way_too(gap, threshold):
    d = wedge.WedgeDetector(threshold)
    fn = d.receiver()
    base = {"boot": "b1", "rank": 0, "iter": 1}
    fn({**base, "event": "iteration", "ts": 0.0, "waiting": 0, "running": 0})  # nothing waits
    for ts, event in ((1.0, "admission.defer"), (2.0, "eviction"), (1.0 + gap, "eviction")):
        fn({**base, "event": event, "ts": ts, "waiting": 1, "running": 0})
    assert [(w.seconds, w.start["ts"], w.end["ts"]) for w in d.found()] == (
        [(gap, 1.0, 1.0 + gap)] if gap > 30 else []
    )
