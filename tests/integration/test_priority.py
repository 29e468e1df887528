"""The priority policy: the waiting line is ordered by priority (the lower value first), then
arrival; each request's `request.received` says its priority and how many it went ahead of.
Under first come, first served the priority changes nothing and is not written."""

from __future__ import annotations

from engine import LLM, SamplingParams

PROMPT = [5, 6, 7, 8]


def finish_order(llm, priorities: list[int]) -> tuple[list[str], list[dict]]:
    sched = llm.core.scheduler
    for i, p in enumerate(priorities):
        params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, priority=p)
        sched.add_request([*PROMPT, i], params, rid=f"p{i}")
    order = []
    while sched.has_work():
        order += [o.rid for o in llm.core.step() if o.finished]
    received = llm.core.receipts.of("request.received")[-len(priorities) :]
    return order, received


def test_the_line_waits_in_order_of_priority_then_arrival(tiny_model_dir):
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=512,
        max_running=1,
        scheduling_policy="priority",
        check_invariants=True,
    )
    order, received = finish_order(llm, [5, 1, 5, 0, 1])
    llm.close()
    assert order == ["p3", "p1", "p4", "p0", "p2"]  # all in line before the first step
    assert [(r["priority"], r["overtook"]) for r in received] == [
        (5, 0),
        (1, 1),
        (5, 0),
        (0, 3),
        (1, 2),
    ]


def test_first_come_first_served_ignores_priority(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, kv_tokens=512, max_running=1, check_invariants=True)
    order, received = finish_order(llm, [5, 1, 0])
    llm.close()
    assert order == ["p0", "p1", "p2"]
    assert not any("priority" in r or "overtook" in r for r in received)
