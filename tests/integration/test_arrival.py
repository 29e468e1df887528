"""A request's latencies count from when the frontend took it in, not from when the scheduler
first saw it: the time it queued before (a busy or stalled loop) is in its ``queue_s``, ``ttft_s``
and ``e2e_s``, and ``request.received`` carries that arrival."""

from __future__ import annotations

import time

from engine import LLM, SamplingParams


def test_latencies_count_from_the_arrival_the_frontend_saw(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, kv_tokens=512, page_size=4)
    sched = llm.core.scheduler
    arrived = time.time() - 40.0  # it stood in line 40 s before the scheduler saw it
    sched.add_request(
        [5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True), rid="late", arrived=arrived
    )
    sched.add_request([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True), rid="now")
    while sched.has_work():
        sched.step()
    (late, now) = (
        [r for r in llm.core.receipts.of(kind) if r["rid"] in ("late", "now")]
        for kind in ("request.received", "request.finish")
    )
    received = {r["rid"]: r for r in late}
    assert received["late"]["arrived"] == round(arrived, 6) and "arrived" not in received["now"]
    finish = {r["rid"]: r for r in now}
    for field in ("queue_s", "ttft_s", "e2e_s"):
        assert finish["late"][field] >= 40.0, finish["late"]
        assert finish["now"][field] < 40.0, finish["now"]
