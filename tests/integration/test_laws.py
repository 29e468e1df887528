"""One test per guard of the engine's laws (docs/ARCHITECTURE.md) that no other test caught
when the guard was broken: each test's docstring names the law it keeps."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.scheduler import checks


def params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def test_one_rank_publishes_no_floor_and_the_local_budget_decides(tiny_model_dir):
    """Law 2: with one rank no floor is published; "no floor" (None) is not a floor."""
    llm = LLM(model=tiny_model_dir, kv_tokens=256, check_invariants=True)
    assert llm.core.scheduler.group.published_floor() is None
    outs = llm.generate([[3, 4, 5]], params(3))
    assert len(outs[0].token_ids) == 3
    r = llm.core.receipts
    assert r.of("group.floor") == []
    (admit,) = r.of("admission.admit")
    assert admit["floor"] is None and admit["local_avail"] == 256


def bare_memory(tiny_model_dir):
    """The memory of an engine with no production rung (``relief_ladder=False``)."""
    llm = LLM(model=tiny_model_dir, kv_tokens=256, relief_ladder=False)
    return llm.core.scheduler.memory, llm.core.receipts


def test_each_relief_rung_records_paid_short_or_raised_and_the_ladder_stops_when_met(
    tiny_model_dir,
):
    """Law 4: relief is a ladder tried in order, each rung fallible; each outcome is a receipt."""
    memory, receipts = bare_memory(tiny_model_dir)
    asked: list[tuple[str, int]] = []

    def pays(name: str, share: int | None):
        def provider(n: int) -> int:
            asked.append((name, n))
            if share is None:
                raise RuntimeError(f"{name} is gone")
            return min(n, share)

        return provider

    memory.register("thin", pays("thin", 3))  # pays less than asked
    memory.register("broken", pays("broken", None))  # raises
    memory.register("full", pays("full", 100))  # pays the whole remainder
    memory.register("spare", pays("spare", 100))  # need is met: never asked
    assert memory.make_room(10, "alloc_net").relieved == 10
    assert asked == [("thin", 10), ("broken", 7), ("full", 7)]
    (engage,) = receipts.of("relief.engage")
    assert engage["shortfall"] == 10 and engage["rungs"] == 4
    rungs = [(x["rung"], x["asked"], x["paid"], x["outcome"]) for x in receipts.of("relief.rung")]
    assert rungs == [
        ("thin", 10, 3, "short"),
        ("broken", 7, 0, "raised"),
        ("full", 7, 7, "paid"),
    ]
    errors = [x["error"] for x in receipts.of("relief.rung")]
    assert errors == [None, "RuntimeError: broken is gone", None]


def test_an_empty_relief_registry_says_so_once(tiny_model_dir):
    """Law 5: a relief registry that is empty says so once, not once per allocation failure."""
    memory, receipts = bare_memory(tiny_model_dir)
    assert memory.make_room(4, "alloc_net").relieved == 0
    assert memory.make_room(8, "alloc_net").relieved == 0
    notices = receipts.of("notice")
    assert len(notices) == 1
    assert notices[0]["text"].startswith("no relief provider is registered")
    assert receipts.of("relief.engage") == []


def test_check_mode_raises_on_the_step_after_the_ledger_breaks(tiny_model_dir):
    """Law 7: the ledger balances; check mode raises after any step that breaks it."""
    llm = LLM(model=tiny_model_dir, kv_tokens=256, check_invariants=True)
    sched = llm.core.scheduler
    sched.add_request([3, 4, 5], params(6))
    sched.step()  # balanced: no raise
    llm.core.allocator._free.pop()  # a page vanishes from the free list behind its back
    with pytest.raises(AssertionError, match="invariants violated.*'ledger'"):
        sched.step()


def test_an_abort_that_leaves_the_engine_idle_runs_the_idle_check(tiny_model_dir):
    """Law 7: in production the ledger is checked whenever the engine goes idle, abort included."""
    llm = LLM(model=tiny_model_dir, kv_tokens=256, check_invariants=False)
    sched = llm.core.scheduler
    req = sched.add_request([3, 4, 5], params(20))
    sched.step()
    llm.core.allocator._free.pop()  # the ledger is short one page
    sched.step()
    assert sched.has_work() and llm.core.receipts.of("invariant.violation") == []
    assert sched.abort(req.rid) is not None
    assert not sched.has_work()
    got = [x["what"] for x in llm.core.receipts.of("invariant.violation")]
    assert got == ["ledger", "allocator"]


def test_a_failing_idle_check_is_a_notice_not_an_exception(tiny_model_dir, monkeypatch):
    """Law 8: a diagnostic cannot raise into the loop it observes."""
    llm = LLM(model=tiny_model_dir, kv_tokens=256, check_invariants=False)

    def broken_check(sched):
        raise RuntimeError("probe broke")

    monkeypatch.setattr(checks, "violations", broken_check)
    outs = llm.generate([[3, 4, 5]], params(4))  # the idle check runs when the engine idles
    assert len(outs[0].token_ids) == 4
    assert not llm.core.scheduler.has_work()
    notices = [x["text"] for x in llm.core.receipts.of("notice")]
    assert notices.count("idle ledger check failed: probe broke") == 1
