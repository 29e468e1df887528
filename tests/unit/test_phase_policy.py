"""The phase policy's rule (``engine.core.phase.decide``) over any backlog sequence: it flips only
where the backlog crosses a threshold, never within the dwell, and a steady load never churns
(at most one flip, whatever the steady value); a backlog that swings between the thresholds
without crossing them flips nothing."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from engine.core.phase import SHARDS, STAGES, Thresholds, decide


def run(backlogs: list[int], t: Thresholds, layout: str = SHARDS) -> list[tuple[int, str, str]]:
    """The flips of a policy deciding once per entry: (index, from, to)."""
    flips, last = [], 0
    for i, b in enumerate(backlogs, 1):
        target, _ = decide(layout, b, i - last, t)
        if target != layout:
            flips.append((i, layout, target))
            layout, last = target, i
    return flips


thresholds = st.builds(
    lambda exit_, gap, dwell: Thresholds(exit_ + gap, exit_, dwell),
    st.integers(0, 5000),
    st.integers(1, 5000),
    st.integers(1, 8),
)


@given(st.lists(st.integers(0, 12000), max_size=200), thresholds, st.sampled_from([SHARDS, STAGES]))
def test_flips_cross_a_threshold_and_keep_the_dwell(backlogs, t, start):
    layout, last = start, 0
    for i, b in enumerate(backlogs, 1):
        target, reason = decide(layout, b, i - last, t)
        if target != layout:
            assert i - last >= t.dwell
            assert (target, reason) in ((STAGES, "backlog_high"), (SHARDS, "backlog_low"))
            assert b >= t.enter if target == STAGES else b <= t.exit
            layout, last = target, i
        else:
            assert reason in ("dwell", "steady")


@given(st.integers(0, 12000), st.integers(1, 200), thresholds, st.sampled_from([SHARDS, STAGES]))
def test_a_steady_load_flips_at_most_once(backlog, n, t, start):
    assert len(run([backlog] * n, t, start)) <= 1


@given(st.lists(st.integers(0, 10), min_size=1, max_size=200), thresholds)
def test_a_backlog_between_the_thresholds_flips_nothing(steps, t):
    assume(t.enter - t.exit >= 2)  # an integer lies between them
    inside = [t.exit + 1 + s * (t.enter - t.exit - 2) // 10 for s in steps]
    assert all(t.exit < b < t.enter for b in inside)
    assert run(inside, t, SHARDS) == [] and run(inside, t, STAGES) == []


def test_a_load_that_rises_and_falls_twice_flips_four_times():
    t = Thresholds(enter=1000, exit=100, dwell=2)
    load = [0] * 3 + [5000] * 5 + [50] * 5 + [5000] * 5 + [0] * 5
    assert [(f, to) for _, f, to in run(load, t)] == [
        (SHARDS, STAGES),
        (STAGES, SHARDS),
        (SHARDS, STAGES),
        (STAGES, SHARDS),
    ]
