"""The follow-up windows' compiled receiver (``audit/fastfollow.c``) against ``audit.followups``'
own, record for record: the same windows, counts, failures, order troubles and errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit import native
from audit.followups import Followups
from audit.foreign import TEXT_BOOT
from audit.model import Pred, ReceiptSel

pytestmark = pytest.mark.skipif(
    native.fast_follower() is None, reason=f"not compiled: {native.why_not()}"
)

WHEN = (
    (ReceiptSel("retract"), "rids"),
    (ReceiptSel("request.received", (Pred("x", "==", 1),)), "rid"),
    (ReceiptSel("admission.admit", (Pred("x", "==", 2),)), "rid"),  # opens, then follows: no
)
THEN = ((ReceiptSel("requeue"), "rid"), (ReceiptSel("admission.admit"), "rid"))
CLOSES = (
    (ReceiptSel("request.finish"), "rid"),
    (ReceiptSel("requeue", (Pred("x", "==", 2),)), "rid"),
)
STOPS = (ReceiptSel("cutover.end"),)
KINDS = (
    "retract",
    "request.received",
    "requeue",
    "admission.admit",
    "request.finish",
    "cutover.end",
    "boot.stop",
)


def windows(compiled: bool) -> tuple[Followups, dict[str, list[Any]]]:
    """A Followups over the selectors above, and its receivers by kind."""
    routes: dict[str, list[Any]] = {}
    with pytest.MonkeyPatch.context() as m:
        if not compiled:
            m.setattr(native, "fast_follower", lambda: None)
        f = Followups(
            WHEN,
            THEN,
            CLOSES,
            STOPS,
            when_key="rid",
            opened="retract",
            ended="boot.stop",
            subscribe=lambda s, fn: routes.setdefault(s.kind, []).append(fn),
            exact=False,
        )
    return f, routes


names = st.sampled_from(["r1", "r2", "r3"])
keys = st.one_of(  # a str key (the compiled way's own) most of the time
    names,
    names,
    names,
    st.integers(0, 2),
    st.none(),
    st.lists(st.sampled_from(["r1", "r2", None, 7]), max_size=3),
    st.just({"r": 1}),
)


@st.composite
def records(draw) -> list[dict[str, Any]]:
    out, seq = [], 0
    for _ in range(draw(st.integers(0, 40))):
        seq += draw(st.sampled_from([1, 1, 1, 2, 0, -3]))
        rec: dict[str, Any] = {
            "event": draw(st.sampled_from(KINDS)),
            "boot": draw(st.sampled_from(["b1", "b1", "b2", TEXT_BOOT])),
            "rank": draw(st.sampled_from([0, 0, 1])),
            "seq": seq,
        }
        for field in ("rid", "rids"):
            if draw(st.integers(0, 3)):
                rec[field] = draw(keys)
        if draw(st.integers(0, 3)):
            rec["x"] = draw(st.sampled_from([1, 2]))
        if draw(st.integers(0, 30)) == 0:
            del rec[draw(st.sampled_from(["boot", "rank", "seq"]))]
        out.append(rec)
    return out


def fed(f: Followups, routes: dict[str, list[Any]], recs: list[dict[str, Any]]) -> list[str]:
    """Each record to its kind's receivers; what each raised, by its type."""
    raised = []
    for rec in recs:
        for fn in routes.get(rec["event"], ()):
            try:
                fn(rec)
            except Exception as e:  # noqa: BLE001 (both ways must raise alike)
                raised.append(type(e).__name__)
    return raised


def state(f: Followups) -> Any:
    ranks = {at: (st.seq, st.stop, dict(st.open)) for at, st in f.ranks.items()}
    return f.summary(), f.disordered, f.failed, ranks


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records())
def test_any_records_are_followed_as_the_python_rule_follows_them(recs):
    compiled, c_routes = windows(True)
    python, p_routes = windows(False)
    assert type(c_routes["requeue"][0]).__name__ == "builtin_function_or_method"
    assert type(p_routes["requeue"][0]).__name__ == "function"
    assert fed(compiled, c_routes, recs) == fed(python, p_routes, recs)
    assert state(compiled) == state(python)


def test_a_window_opened_followed_and_closed_is_counted_under_its_first_then():
    f, routes = windows(True)
    recs = [
        {"event": "retract", "boot": "b1", "rank": 0, "seq": 1, "rids": ["r1", "r2"]},
        {"event": "admission.admit", "boot": "b1", "rank": 0, "seq": 2, "rid": "r1"},
        {"event": "request.finish", "boot": "b1", "rank": 0, "seq": 3, "rid": "r1"},
        {"event": "request.finish", "boot": "b1", "rank": 0, "seq": 4, "rid": "r2"},
        {"event": "request.received", "boot": "b1", "rank": 0, "seq": 5, "rid": "r3", "x": 1},
    ]
    assert fed(f, routes, recs) == []
    assert f.summary()[:2] == (3, 1) and f.by_then == [0, 1]
    assert f.failed == [("r2 (rank 0)", "retract at seq 1, its window closed at seq 4")]
    assert list(f.ranks[("b1", 0)].open) == ["r3"]
