"""The step budget's arithmetic: the room a step leaves for prefill, the chunk planned within it,
and why the line waits when it is spent."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.scheduler.admission import (
    Admit,
    Park,
    StepPlan,
    defer_reason,
    line_closed,
    plan_chunk,
    plan_in_step,
    prefill_floor,
    step_room,
)


def test_no_step_budget_leaves_no_room_bound():
    assert step_room(step_tokens=None, decodes=500, planned=0, page_size=16) is None


def test_the_decodes_and_the_chunks_planned_come_off_the_room():
    assert step_room(step_tokens=64, decodes=8, planned=0, page_size=4) == 56
    assert step_room(step_tokens=64, decodes=8, planned=40, page_size=4) == 16
    assert step_room(step_tokens=64, decodes=8, planned=56, page_size=4) == 0


def test_the_floor_matches_the_decodes_in_whole_pages_and_is_one_page_at_least():
    assert prefill_floor(64, 1) == 64
    assert prefill_floor(64, 16) == 64
    assert prefill_floor(70, 16) == 64  # rounded down to whole pages
    assert prefill_floor(12, 16) == 16  # below one page: one page
    assert prefill_floor(0, 4) == 4
    assert prefill_floor(8, 4) == 8


def test_the_first_chunk_of_a_step_gets_the_floor_when_decodes_fill_the_budget():
    """The starvation rule: decodes that fill (or overfill) the budget leave the first chunk
    the floor, never nothing; a later chunk of the same step gets no floor."""
    assert step_room(step_tokens=64, decodes=64, planned=0, page_size=1) == 64
    assert step_room(step_tokens=64, decodes=90, planned=0, page_size=16) == 80
    assert step_room(step_tokens=64, decodes=40, planned=0, page_size=4) == 40  # 24 < the floor
    assert step_room(step_tokens=64, decodes=62, planned=0, page_size=4) == 60
    assert step_room(step_tokens=64, decodes=16, planned=0, page_size=4) == 48  # room above it
    assert step_room(step_tokens=64, decodes=64, planned=16, page_size=4) == -16


def test_a_chunk_within_the_room_is_not_cut():
    got = plan_in_step(held=0, remaining=40, chunk_tokens=2048, room=56, budget=1000, page_size=4)
    assert got == StepPlan(Admit(40, 10), False)


def test_the_step_budget_cuts_a_chunk_to_its_room_on_a_page_boundary():
    got = plan_in_step(
        held=0, remaining=1500, chunk_tokens=2048, room=58, budget=10**6, page_size=4
    )
    assert got == StepPlan(Admit(56, 14), True)
    # mid-page: the partial page's free slots count, the chunk still ends on a boundary
    got = plan_in_step(held=6, remaining=100, chunk_tokens=2048, room=12, budget=10**6, page_size=4)
    assert got == StepPlan(Admit(10, 2), True)  # slots 6..16: two fresh pages


def test_memory_that_binds_first_is_not_called_a_step_cut():
    got = plan_in_step(held=0, remaining=1500, chunk_tokens=2048, room=500, budget=40, page_size=4)
    assert got == StepPlan(Admit(40, 10), False)
    got = plan_in_step(held=0, remaining=1500, chunk_tokens=2048, room=500, budget=3, page_size=4)
    assert got.plan == Park("below_page", need=1500, fundable=0) and not got.step_cut


def test_a_room_below_the_next_page_boundary_waits_for_the_step_not_for_memory():
    for room in (-8, 0, 3):
        got = plan_in_step(
            held=0, remaining=100, chunk_tokens=2048, room=room, budget=10**6, page_size=4
        )
        assert isinstance(got.plan, Park) and got.plan.reason == "step_budget" and got.step_cut
        assert got.plan.need == 100
    # a request whose whole rest fits the room is admitted, even mid-page
    got = plan_in_step(held=0, remaining=3, chunk_tokens=2048, room=3, budget=10**6, page_size=4)
    assert got == StepPlan(Admit(3, 1), False)


def test_a_spent_step_budget_closes_the_line_and_says_so():
    assert line_closed(chunk_budget=100, running=8, max_running=64, step_budget=0) == "step_budget"
    assert line_closed(chunk_budget=100, running=8, max_running=64, step_budget=-3) == "step_budget"
    assert line_closed(chunk_budget=100, running=8, max_running=64, step_budget=1) is None
    assert line_closed(chunk_budget=100, running=8, max_running=64, step_budget=None) is None
    # the chunk budget's own reason stays first where both are spent
    assert line_closed(chunk_budget=0, running=8, max_running=64, step_budget=0) == "chunk_budget"


def test_a_step_budget_park_defers_with_its_own_reason():
    kw = dict(chunked=False, inflight=0, settled=0, max_running=8)
    assert defer_reason(Park("step_budget", need=9, fundable=12), **kw) == "step_budget"
    assert defer_reason(Park("below_page", need=9, fundable=0), **kw) == "budget"


plans = dict(
    held=st.integers(0, 4096),
    remaining=st.integers(1, 4096),
    chunk_tokens=st.integers(1, 4096),
    budget=st.integers(-64, 8192),
    page_size=st.sampled_from([1, 2, 4, 16]),
)


@given(room=st.integers(-64, 4096), **plans)
def test_a_chunk_never_exceeds_its_room_nor_what_memory_funds(
    held, remaining, chunk_tokens, budget, page_size, room
):
    kw = dict(held=held, remaining=remaining, chunk_tokens=chunk_tokens, budget=budget)
    free = plan_chunk(**kw, page_size=page_size)
    got = plan_in_step(**kw, room=room, page_size=page_size)
    if isinstance(got.plan, Admit):
        assert got.plan.tokens <= room
        assert isinstance(free, Admit) and got.plan.tokens <= free.tokens
        assert got.step_cut == (got.plan.tokens < free.tokens)
    elif got.plan.reason == "below_page":  # memory alone: the step budget did not decide
        assert got.plan == free and not got.step_cut
    else:
        assert isinstance(free, Admit) and free.tokens > room and got.step_cut


@given(**plans)
def test_no_step_budget_plans_exactly_as_before(held, remaining, chunk_tokens, budget, page_size):
    kw = dict(held=held, remaining=remaining, chunk_tokens=chunk_tokens, budget=budget)
    got = plan_in_step(**kw, room=None, page_size=page_size)
    assert got == StepPlan(plan_chunk(**kw, page_size=page_size), False)


@given(
    held=st.integers(0, 4096),
    remaining=st.integers(1, 4096),
    decodes=st.integers(0, 512),
    step_tokens=st.integers(16, 512),
    page_size=st.sampled_from([1, 2, 4, 16]),
)
def test_the_first_chunk_always_moves_when_memory_funds_a_page(
    held, remaining, decodes, step_tokens, page_size
):
    room = step_room(step_tokens=step_tokens, decodes=decodes, planned=0, page_size=page_size)
    got = plan_in_step(
        held=held,
        remaining=remaining,
        chunk_tokens=2048,
        room=room,
        budget=page_size,
        page_size=page_size,
    )
    assert isinstance(got.plan, Admit) and got.plan.tokens >= 1
    # the forward stays within the budget, or within twice the decodes (a page more with few)
    assert decodes + got.plan.tokens <= max(step_tokens, 2 * decodes, decodes + page_size)


@pytest.mark.parametrize(
    ("kw", "rule"),
    [
        ({"step_tokens": 0}, "None or an integer >= page_size (1)"),
        ({"step_tokens": 2.0}, "None or an integer >= page_size (1)"),
        ({"step_tokens": True}, "None or an integer >= page_size (1)"),
        ({"step_tokens": 8, "page_size": 16}, "None or an integer >= page_size (16)"),
    ],
)
def test_a_step_budget_below_one_page_is_refused_naming_it(kw, rule):
    with pytest.raises(ValueError, match="^" + re.escape(f"step_tokens must be {rule}")):
        EngineConfig.from_kwargs(**kw)


def test_no_step_budget_and_a_budget_of_one_page_are_accepted():
    assert EngineConfig.from_kwargs(step_tokens=None).scheduler.step_tokens is None
    assert EngineConfig.from_kwargs(step_tokens=16, page_size=16).scheduler.step_tokens == 16


def test_engine_serve_defaults_to_the_measured_step_budget_and_offline_to_none():
    import typer

    from cli.engine_app import app
    from engine.config import SERVE_STEP_TOKENS

    serve = typer.main.get_command(app).commands["serve"]
    (opt,) = [p for p in serve.params if p.name == "step_tokens"]
    assert opt.default == SERVE_STEP_TOKENS == 32
    assert EngineConfig().scheduler.step_tokens is None
