"""Admission decisions as pure functions: the budget, the chunk plan, the new-token ratio, why
the line waits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.scheduler.admission import (
    MAX_INFLIGHT_CHUNKED,
    Admit,
    Budget,
    NewTokenRatio,
    Park,
    decode_reserve,
    defer_reason,
    line_closed,
    plan_chunk,
    running_ceiling,
)


def test_running_ceiling_is_one_over_max_running():
    assert MAX_INFLIGHT_CHUNKED == 1
    assert running_ceiling(8) == 9


def test_no_published_floor_leaves_the_local_term_alone():
    b = Budget(local_avail=100, evictable=50, decode_reserve=30, floor=None)
    assert b.remaining == b.local_term == 120


def test_a_published_floor_bounds_the_local_term():
    assert Budget(local_avail=100, evictable=50, decode_reserve=30, floor=40).remaining == 40
    # the floor never raises a budget the local term has already cut
    assert Budget(local_avail=10, evictable=0, decode_reserve=0, floor=1000).remaining == 10


def test_a_published_floor_of_zero_binds_and_is_not_no_floor():
    zero = Budget(local_avail=500, evictable=0, decode_reserve=0, floor=0)
    none = Budget(local_avail=500, evictable=0, decode_reserve=0, floor=None)
    assert zero.remaining == 0 and none.remaining == 500


def test_each_admission_spends_the_shared_offset_on_both_terms():
    b = Budget(local_avail=100, evictable=0, decode_reserve=0, floor=60)
    b.spend(50)
    assert b.local_term == 50 and b.remaining == 10
    b.spend(10)
    assert b.remaining == 0


def test_a_zero_budget_never_schedules_a_chunk():
    """The field specimen: a chunk admitted with a zero budget. It must park instead."""
    for budget in (0, -5, 3):  # 3 < one page of 4
        plan = plan_chunk(held=0, remaining=512, chunk_tokens=256, budget=budget, page_size=4)
        assert isinstance(plan, Park)
        assert plan.reason == "below_page" and plan.need == 512 and plan.fundable == 0


def test_a_chunk_takes_what_exists_up_to_the_nominal_chunk():
    assert plan_chunk(held=0, remaining=512, chunk_tokens=256, budget=10_000, page_size=4) == Admit(
        256, 64
    )
    # less than nominal is funded: take it, ending on a page boundary
    assert plan_chunk(held=0, remaining=512, chunk_tokens=256, budget=103, page_size=4) == Admit(
        100, 25
    )
    # the last chunk may end mid-page
    assert plan_chunk(held=0, remaining=7, chunk_tokens=256, budget=8, page_size=4) == Admit(7, 2)


def test_the_partial_last_page_is_free_to_fill():
    # 6 tokens held on 4-token pages: 2 slots left in the last page cost no new page
    assert plan_chunk(held=6, remaining=2, chunk_tokens=256, budget=0, page_size=4) == Admit(2, 0)
    # with a zero budget it may only fill that page, and a partial chunk ends at its boundary
    assert plan_chunk(held=6, remaining=10, chunk_tokens=256, budget=0, page_size=4) == Admit(2, 0)


def best_chunk(held, remaining, chunk, budget, page):
    """Brute force: the longest chunk whose fresh pages fit the budget and that ends on a page
    boundary unless it finishes the prefill."""
    room = (-held) % page
    best = 0
    for t in range(1, min(remaining, chunk) + 1):
        pages = -(-max(0, t - room) // page)
        if pages * page <= max(0, budget) and (t == remaining or (held + t) % page == 0):
            best = t
    return best


@given(
    held=st.integers(0, 300),
    remaining=st.integers(1, 400),
    chunk=st.integers(1, 400),
    budget=st.integers(-100, 800),
    page=st.sampled_from([1, 2, 4, 16]),
)
def test_a_plan_is_the_longest_chunk_the_budget_funds(held, remaining, chunk, budget, page):
    plan = plan_chunk(
        held=held, remaining=remaining, chunk_tokens=chunk, budget=budget, page_size=page
    )
    best = best_chunk(held, remaining, chunk, budget, page)
    if best == 0:
        assert isinstance(plan, Park) and plan.need == remaining
        return
    assert isinstance(plan, Admit) and plan.tokens == best
    room = (-held) % page
    assert plan.pages == -(-max(0, plan.tokens - room) // page)
    assert plan.pages * page <= max(0, budget)


def test_plan_chunk_rejects_nothing_to_do():
    with pytest.raises(ValueError, match="nothing to prefill"):
        plan_chunk(held=3, remaining=0, chunk_tokens=8, budget=8, page_size=1)


def test_new_token_ratio_decays_to_its_floor_and_jumps_on_retraction():
    r = NewTokenRatio(value=0.5, minimum=0.1, decay=0.2)
    r.step()
    r.step()
    assert r.value == pytest.approx(0.1)
    r.step()
    assert r.value == pytest.approx(0.1)
    old, new = r.on_retract(decoded=100, remaining_max=100, retracted=2)
    assert old == pytest.approx(0.1) and new > old and new <= 1.0


def test_decode_reserve_rounds_up_and_clips():
    assert decode_reserve([10, 10], 0.25) == 6  # ceil(2.5) * 2
    assert decode_reserve([10**6], 1.0, clip=4096) == 4096
    assert decode_reserve([], 0.7) == 0


def test_the_line_closes_when_the_chunk_budget_is_spent_or_the_ceiling_is_reached():
    assert line_closed(chunk_budget=0, running=0, max_running=4) == "chunk_budget"
    assert line_closed(chunk_budget=-3, running=9, max_running=4) == "chunk_budget"  # first
    assert line_closed(chunk_budget=16, running=5, max_running=4) == "max_running"  # 4 + 1
    assert line_closed(chunk_budget=16, running=4, max_running=4) is None  # the extra slot


def test_defer_reason_names_why_a_planned_request_waits():
    park = Park("below_page", need=40, fundable=0)
    admit = Admit(tokens=16, pages=1)
    kw = dict(inflight=0, settled=0, max_running=4)
    assert defer_reason(park, chunked=False, **kw) == "budget"
    assert defer_reason(admit, chunked=False, **kw) is None
    # one chunked prefill in flight at a time
    assert defer_reason(admit, chunked=True, inflight=1, settled=0, max_running=4) == (
        "inflight_chunk"
    )
    assert defer_reason(admit, chunked=True, inflight=0, settled=4, max_running=4) is None
    # a full set of settled requests leaves the extra slot to a chunk only
    assert defer_reason(admit, chunked=False, inflight=0, settled=4, max_running=4) == (
        "max_running"
    )
    # a park outranks every other reason: the budget is what the receipt must name
    assert defer_reason(park, chunked=False, inflight=1, settled=4, max_running=4) == "budget"


def test_a_request_overtakes_the_waiting_of_a_larger_priority_value_and_never_its_equals():
    from engine.scheduler.admission import overtakes

    assert overtakes([], 5) == 0
    assert overtakes([0, 1, 1, 3], 1) == 1  # ahead of the 3, behind the 1s (they came first)
    assert overtakes([0, 1, 1, 3], -2) == 4
    assert overtakes([0, 1, 1, 3], 7) == 0
    assert overtakes([9, 0, 5], 1) == 1  # a retracted 9 at the front stays there
