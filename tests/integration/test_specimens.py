"""The failures the laws were written against, reproduced in-process, and one decision test per receipt kind:
each receipt carries the inputs of its decision."""

from __future__ import annotations

import dataclasses

import pytest

from engine import LLM, SamplingParams
from engine.scheduler.memory import KVPoolExhausted
from engine.scheduler.victims import pick_victims
from tests.fakes import SetFloor, llm_with_group
from tests.integration.test_pressure import three_at_once, workload


def tiny(tiny_model_dir, **kw):
    kw.setdefault("check_invariants", True)
    return LLM(model=tiny_model_dir, **kw)


def run(llm, prompts, **params):
    params.setdefault("ignore_eos", True)
    params.setdefault("temperature", 0)
    return llm.generate(prompts, SamplingParams(**params))


# -- a zero budget never schedules a chunk ---------------------------------------------------


def test_a_published_floor_of_zero_admits_nothing_and_says_why(tiny_model_dir):
    group = SetFloor(0)
    llm = llm_with_group(tiny_model_dir, group, kv_tokens=1024, check_invariants=True)
    sched = llm.core.scheduler
    req = sched.add_request([5] * 20, SamplingParams(max_tokens=4, ignore_eos=True))
    for _ in range(3):
        assert sched.step() == []
    assert req.row is None and sched.waiting[0] is req
    defer = llm.core.receipts.of("admission.defer")[-1]
    assert defer["reason"] == "budget" and defer["floor"] == 0 and defer["remaining"] == 0
    assert defer["local_avail"] == 1024  # the local pool had room: the floor is what bound
    floors = llm.core.receipts.of("group.floor")
    assert floors and floors[-1]["floor"] == 0
    group.floor = None  # no floor published: the local term decides alone
    while sched.has_work():
        sched.step()
    assert req.finish_reason == "length"


def test_an_inflight_chunk_parks_at_zero_budget_and_resumes(tiny_model_dir):
    group = SetFloor(None)
    kw = dict(kv_tokens=1024, chunk_tokens=8, page_size=4, check_invariants=True)
    llm = llm_with_group(tiny_model_dir, group, **kw)
    sched = llm.core.scheduler
    req = sched.add_request(list(range(2, 40)), SamplingParams(max_tokens=3, ignore_eos=True))
    sched.step()  # first chunk of 8
    assert req.kv_len == 8 and req.prefilling
    group.floor = 0
    sched.step()
    assert req.state.value == "parked" and req.kv_len == 8  # zero tokens scheduled, kept
    park = llm.core.receipts.of("admission.park")[0]
    assert park == park | {
        "rid": req.rid,
        "reason": "below_page",
        "need": 30,
        "fundable": 0,
        "floor": 0,
    }
    sched.step()
    assert len(llm.core.receipts.of("admission.park")) == 1  # parked once, not once per round
    group.floor = None
    while sched.has_work():
        sched.step()
    unpark = llm.core.receipts.of("admission.unpark")[0]
    assert unpark["rid"] == req.rid and unpark["tokens"] == 8
    assert req.finish_reason == "length" and req.parks == 1
    finish = llm.core.receipts.of("request.finish")[0]
    assert finish["parks"] == 1 and finish["tokens"] == 3


# -- the allocation-site net ------------------------------------------------------------------


def exhaust(llm):
    """Take every free page away from the scheduler, as another tenant of the pool would."""
    alloc = llm.core.allocator
    return alloc.alloc(alloc.available_size())


def net_alone(tiny_model_dir):
    """The net alone, with only the providers a test registers (no production rung): one
    request prefilled 12 tokens, its next page due at token 13, and every free page taken
    away. Returns the engine, its scheduler, the request and the pages taken."""
    llm = tiny(
        tiny_model_dir, kv_tokens=128, page_size=4, check_invariants=False, relief_ladder=False
    )
    sched = llm.core.scheduler
    req = sched.add_request([7] * 12, SamplingParams(max_tokens=6, ignore_eos=True))
    sched.step()
    return llm, sched, req, exhaust(llm)


def test_the_net_flushes_staged_frees_before_giving_up(tiny_model_dir):
    llm = tiny(tiny_model_dir, kv_tokens=256, page_size=4)
    sched, alloc = llm.core.scheduler, llm.core.allocator
    sched.add_request([7] * 10, SamplingParams(max_tokens=6, ignore_eos=True))
    sched.step()  # prefill: 10 tokens on 3 pages, last page half full
    held = exhaust(llm)
    alloc.free_group_begin()
    alloc.free(held[:8])  # two pages freed, but only staged
    assert alloc.available_size() == 0 and alloc.staged_size() == 8
    # `held` is outside the ledger during this test
    checks_off = dataclasses.replace(sched.config.scheduler, check_invariants=False)
    sched.config = dataclasses.replace(sched.config, scheduler=checks_off)
    sched.step()
    sched.step()  # decode at 11 and 12 fill the page; 13 needs a fresh page: only staged ones exist
    sched.step()
    r = llm.core.receipts
    flush = r.of("alloc.flush")[0]
    assert flush["staged"] == 8 and flush["freed"] == 8 and flush["need"] == 4
    assert r.of("alloc.retry")[0]["ok"] is True
    assert not r.of("alloc.oom")
    assert alloc.group_open  # the caller's group is still open ...
    assert alloc.free_group_end() == 0  # ... and closing it frees nothing twice
    alloc.free(held[8:])
    while sched.has_work():
        sched.step()
    sched.check()


def test_the_net_retries_with_relieved_memory_instead_of_raising(tiny_model_dir):
    llm, sched, req, held = net_alone(tiny_model_dir)
    alloc = llm.core.allocator
    asked = []

    def give_back(n):
        asked.append(n)
        alloc.free(held[:n])
        return n

    sched.memory.register("test-tenant", give_back)
    sched.step()  # token 13 needs a fresh page; the relief pays it
    r = llm.core.receipts
    relief = r.of("alloc.relief")[0]
    assert relief["need"] == 4 and relief["relieved"] == 4 and asked == [4]
    assert r.of("alloc.retry")[0]["ok"] is True and not r.of("alloc.oom")
    assert len(req.output_ids) == 2


def test_each_relief_rung_leaves_a_receipt_and_a_raising_one_is_an_outcome(tiny_model_dir):
    llm, sched, _, held = net_alone(tiny_model_dir)
    alloc = llm.core.allocator

    def broken(n):
        raise RuntimeError("tenant is gone")

    def give_back(n):
        alloc.free(held[:n])
        return n

    sched.memory.register("broken", broken)
    sched.memory.register("tenant", give_back)
    sched.step()
    r = llm.core.receipts
    (engage,) = r.of("relief.engage")
    assert engage["shortfall"] == 4 and engage["rungs"] == 2
    rungs = [(x["rung"], x["asked"], x["paid"], x["outcome"]) for x in r.of("relief.rung")]
    assert rungs == [("broken", 4, 0, "raised"), ("tenant", 4, 4, "paid")]
    assert "tenant is gone" in r.of("relief.rung")[0]["error"]
    assert r.of("alloc.retry")[0]["ok"] is True


def test_an_empty_net_raises_the_original_error_with_the_numbers(tiny_model_dir):
    llm, sched, _, _ = net_alone(tiny_model_dir)
    with pytest.raises(KVPoolExhausted, match="cannot fund 4 tokens .* available 0"):
        sched.step()
    r = llm.core.receipts
    assert [x["text"] for x in r.of("notice")] == [
        "no relief provider is registered at the allocation site: admission is the whole guarantee"
    ]
    oom = r.of("alloc.oom")[0]
    assert oom["need"] == 4 and oom["available"] == 0 and oom["capacity"] == 128
    assert r.of("alloc.retry")[0]["ok"] is False


def test_the_net_relieves_once_and_retries_once_before_it_raises(tiny_model_dir):
    """Law 5: one relief, one retry of the same call, then the original error: a tenant that
    frees nothing is asked once, not again and again."""
    llm, sched, _, _ = net_alone(tiny_model_dir)
    asked: list[int] = []
    sched.memory.register("stingy", lambda n: asked.append(n) or 0)
    with pytest.raises(KVPoolExhausted, match="cannot fund 4 tokens"):
        sched.step()
    r = llm.core.receipts
    assert asked == [4] and len(r.of("relief.engage")) == 1
    assert len(r.of("alloc.relief")) == 1 and len(r.of("alloc.oom")) == 1
    assert [x["ok"] for x in r.of("alloc.retry")] == [False]


# -- decisions carry their inputs ------------------------------------------------------------


def test_admit_receipt_names_its_budget_inputs_and_prefix_hit(tiny_model_dir):
    llm = tiny(tiny_model_dir, kv_tokens=512, page_size=4)
    prompt = list(range(2, 30))
    run(llm, [prompt], max_tokens=2)
    run(llm, [prompt + [40, 41]], max_tokens=2)
    first, second = llm.core.receipts.of("admission.admit")
    for a in (first, second):
        for k in (
            "local_avail",
            "evictable",
            "decode_reserve",
            "floor",
            "offset",
            "remaining",
            "tokens",
            "pages",
        ):
            assert k in a
    assert first["prefix_hit"] == 0 and first["tokens"] == 28 and first["local_avail"] == 512
    assert second["prefix_hit"] == 28 and second["tokens"] == 2  # served from the prefix cache
    finish = llm.core.receipts.of("request.finish")[1]
    assert finish["cached"] == 28 and finish["prompt_tokens"] == 30
    for k in ("queue_s", "ttft_s", "e2e_s", "parks", "retractions", "reason"):
        assert k in finish
    assert 0 <= finish["queue_s"] <= finish["ttft_s"] <= finish["e2e_s"]


def test_retract_and_requeue_receipts_name_victims_and_ratio(tiny_model_dir):
    # two requests that fit together at first, then outgrow the pool while decoding
    llm = tiny(tiny_model_dir, kv_tokens=64, chunk_tokens=64)
    outs = run(llm, [[3] * 20, [4] * 10], max_tokens=30)
    assert [len(o.token_ids) for o in outs] == [30, 30]
    r = llm.core.receipts
    retract = r.of("retract")[0]
    assert retract["ratio_new"] > retract["ratio_old"] and retract["tokens_freed"] > 0
    # the decision's inputs are in the receipt: candidates in retraction order, fewest
    # generated first, ties by the longest prompt; the victims are a prefix of them
    cands = retract["candidates"]
    assert cands == sorted(cands, key=lambda c: (c[1], -c[2]))
    assert retract["rids"] == [c[0] for c in cands[: len(retract["rids"])]]
    assert len(retract["rids"]) < len(cands)  # never the last running request
    assert retract["need"] > retract["available"] and retract["evictable"] == 0
    retracted = [rid for x in r.of("retract") for rid in x["rids"]]
    assert [q["rid"] for q in r.of("requeue")] == retracted  # every retraction is requeued


def test_iteration_receipt_at_the_interval_and_when_the_queue_moves(tiny_model_dir):
    """Sampled every N steps, and written after a step that changed running, waiting or parked:
    the queue is in the log from the first step; a step that moved none of them writes none."""
    llm = tiny(tiny_model_dir, kv_tokens=512, iteration_receipt_interval=5)
    run(llm, [[3, 4, 5]], max_tokens=12)
    its = llm.core.receipts.of("iteration")
    got = [(r["iter"], r["running"], r["waiting"]) for r in its]
    assert got == [(1, 1, 0), (5, 1, 0), (10, 1, 0), (12, 0, 0)]  # admitted, sampled, ended
    for k in ("running", "waiting", "parked", "token_usage", "avail", "evictable", "staged"):
        assert k in its[0]
    off = tiny(tiny_model_dir, kv_tokens=512, iteration_receipt_interval=0)
    run(off, [[3, 4, 5]], max_tokens=12)
    assert off.core.receipts.of("iteration") == []  # 0 is off, the changes included


def test_every_step_that_moved_the_queue_has_an_iteration_receipt_and_no_other(tiny_model_dir):
    prompts, params = workload(300, n=12, seed=2)
    llm = tiny(
        tiny_model_dir,
        kv_tokens=three_at_once(prompts, params),
        chunk_tokens=32,
        max_running=4,
        relief_ladder=False,
        iteration_receipt_interval=50,
    )
    sched = llm.core.scheduler
    for p, q in zip(prompts[:6], params[:6]):
        sched.add_request(p, q)
    expected, before = [], (0, 0, 0)
    while sched.has_work():
        if sched.receipts.iter == 20:  # arrivals between steps move the queue too
            for p, q in zip(prompts[6:], params[6:]):
                sched.add_request(p, q)
        sched.step()
        s = sched.snapshot()
        now = (s.running, s.waiting, s.parked)
        if now != before or sched.receipts.iter % 50 == 0:
            expected.append((sched.receipts.iter, *now))
        before = now
    its = llm.core.receipts.of("iteration")
    assert [(r["iter"], r["running"], r["waiting"], r["parked"]) for r in its] == expected
    assert len(its) < sched.receipts.iter / 2  # steps that moved nothing wrote nothing
    assert any(r["parked"] for r in its) and its[-1]["running"] == its[-1]["waiting"] == 0


def test_abort_frees_memory_and_says_why(tiny_model_dir):
    llm = tiny(tiny_model_dir, kv_tokens=512)
    sched = llm.core.scheduler
    req = sched.add_request([3] * 30, SamplingParams(max_tokens=50, ignore_eos=True))
    sched.step()
    sched.step()
    assert sched.abort(req.rid, reason="client_disconnect")
    abort = llm.core.receipts.of("request.abort")[0]
    assert (
        abort["rid"] == req.rid and abort["reason"] == "client_disconnect" and abort["tokens"] == 2
    )
    assert sched.cache.protected_size() == 0 and not sched.running
    assert llm.core.allocator.available_size() + sched.cache.evictable_size() == 512
    assert not sched.abort(req.rid)  # a finished request cannot be aborted twice


def test_retraction_never_takes_the_last_running_request(tiny_model_dir):
    llm = tiny(tiny_model_dir, kv_tokens=512)
    sched = llm.core.scheduler
    for n in (5, 9, 7):
        sched.add_request([3] * n, SamplingParams(max_tokens=20, ignore_eos=True))
    sched.step()
    assert len(sched.running) == 3
    alloc = llm.core.allocator
    # more than retracting everyone could pay
    victims = pick_victims(
        sched.running,
        need=10**6,
        available=alloc.available_size(),
        evictable=sched.cache.evictable_size(),
        page_size=alloc.page_size,
    )
    assert len(victims) == 2 and all(v in sched.running for v in victims)
    assert [v.prompt_len for v in victims] == [9, 7]  # equal output: longest prompts first
