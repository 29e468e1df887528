"""The host KV tier in the engine: multi-turn chats sharing a long system prompt, more chats
than the device pool holds. Cold prefixes spill to the host and load back on the next turn's
hit, and greedy output is token-identical to an unconstrained run; both ledgers balance after
every step (check mode)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from engine import LLM, SamplingParams
from engine.scheduler.ledger import ledger_violations, read_host_ledger
from tests.conftest import requires_default_model


def chats(
    llm: LLM, vocab: int, count: int = 6, turns: int = 3, system: int = 96, seed: int = 0
) -> list[list[int]]:
    """Every chat's turns, all chats of a turn submitted together; each turn's prompt is
    the whole history so far (system prompt, earlier turns and answers) plus a new question."""
    rng = random.Random(seed)
    shared = [rng.randrange(2, vocab) for _ in range(system)]
    history = [shared + [rng.randrange(2, vocab) for _ in range(12)] for _ in range(count)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    answers = []
    for _ in range(turns):
        outs = llm.generate(history, params)
        answers += [o.token_ids for o in outs]
        history = [
            h + o.token_ids + [rng.randrange(2, vocab) for _ in range(rng.randint(4, 10))]
            for h, o in zip(history, outs)
        ]
    return answers


def tiered(model, **kw) -> LLM:
    """A device pool that holds the system prompt and about two chats, a host tier beside it."""
    return LLM(
        model=model, check_invariants=True, **{"kv_tokens": 256, "host_kv_tokens": 4096, **kw}
    )


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_with_spill_and_load_back_equals_an_unconstrained_run(tiny_model_dir, page_size):
    roomy = LLM(model=tiny_model_dir, kv_tokens=8192, page_size=page_size, check_invariants=True)
    expected = chats(roomy, 300)
    llm = tiered(tiny_model_dir, page_size=page_size)
    assert chats(llm, 300) == expected
    r = llm.core.receipts
    spills, loads = r.of("tier.spill"), r.of("tier.load")
    assert sum(s["tokens"] for s in spills) > 0 and sum(x["tokens"] for x in loads) > 0
    bpt = llm.core.kv.bytes_per_token
    assert all(x["bytes"] == x["tokens"] * bpt for x in spills + loads)
    assert all(x["rid"] in llm.core.scheduler.requests or x["rid"].startswith("r-") for x in loads)
    # a load happens before the request's extend: its admission counts the loaded tokens as hit
    admits = {a["rid"]: a for a in r.of("admission.admit")}
    for load in loads:
        assert admits[load["rid"]]["prefix_hit"] >= load["tokens"]
    assert not r.of("invariant.violation") and not r.of("alloc.oom")
    assert not r.of("eviction.under_delivered")


def test_the_tier_raises_the_prefix_hit_rate_of_the_same_chats(tiny_model_dir):
    def later_turns_hit_rate(llm: LLM) -> float:
        chats(llm, 300, turns=4)
        later = llm.core.receipts.of("request.finish")[6:]  # after every chat's first turn
        return sum(e["cached"] for e in later) / sum(e["prompt_tokens"] for e in later)

    without = later_turns_hit_rate(tiered(tiny_model_dir, host_kv_tokens=0))
    with_tier = later_turns_hit_rate(tiered(tiny_model_dir))
    assert with_tier > 0.9 and with_tier > without + 0.1, (with_tier, without)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_both_ledgers_balance_after_every_step(tiny_model_dir, page_size):
    """Law 7 with a second tier: the device ledger and the host ledger, after every step. First
    one chat alone, whose cached KV is then spilled while nothing else moves; then three waves
    of all the chats, under pressure, hitting what was spilled."""
    llm = tiered(tiny_model_dir, page_size=page_size, host_kv_tokens=1024, max_running=6)
    sched, core = llm.core.scheduler, llm.core
    rng = random.Random(page_size)
    system = [rng.randrange(2, 300) for _ in range(64)]
    history = [system + [rng.randrange(2, 300) for _ in range(20)] for _ in range(6)]

    def balanced() -> None:
        assert (
            ledger_violations(core.allocator, sched.cache, sched.memory.holdings.private_tokens())
            == []
        )
        host = read_host_ledger(core.host_tier)
        assert host.free + host.used == host.capacity == 1024 - 1024 % page_size

    for wave in range(4):
        batch = history[:1] if wave == 0 else history
        reqs = [
            sched.add_request(h, SamplingParams(max_tokens=rng.randint(1, 12), seed=wave * 10 + i))
            for i, h in enumerate(batch)
        ]
        while sched.has_work():
            sched.step()  # check mode raises on a broken ledger; the numbers are read here too
            balanced()
        if wave == 0:  # idle: spill what it cached, the ledgers must still balance
            assert sched.cache.evict(sched.cache.evictable_size(), reason="test") > 0
            balanced()
        history[: len(reqs)] = [h + r.output_ids + [7] * 4 for h, r in zip(history, reqs)]
    kinds = Counter(x["event"] for x in core.receipts.records)
    assert kinds["tier.spill"] > 1 and kinds["tier.load"] > 0, kinds
    assert core.allocator.available_size() + sched.cache.evictable_size() == core.allocator.capacity


def test_tier_sized_says_which_path_sized_the_host_tier(tiny_model_dir):
    on = LLM(model=tiny_model_dir, kv_tokens=256, host_kv_tokens=1000, page_size=16)
    (sized,) = on.core.receipts.of("tier.sized")
    assert sized["path"] == "configured" and sized["host_kv_tokens"] == 992
    assert on.core.host_tier.capacity == 992
    off = LLM(model=tiny_model_dir, kv_tokens=256, host_kv_tokens=1000, prefix_cache=False)
    (sized,) = off.core.receipts.of("tier.sized")
    assert sized["path"] == "off" and sized["reason"] == "no prefix cache"
    assert off.core.host_tier is None


@pytest.mark.slow
@requires_default_model
def test_default_model_spill_and_load_back_changes_no_token():
    roomy = LLM(kv_tokens=16384, check_invariants=True)
    expected = chats(roomy, 49152)
    llm = tiered(None)  # the tiny model's proportions: the same scheduling, real weights
    assert chats(llm, 49152) == expected
    kinds = Counter(x["event"] for x in llm.core.receipts.records)
    assert kinds["tier.spill"] > 0 and kinds["tier.load"] > 0, kinds
    assert kinds["invariant.violation"] == 0 and kinds["alloc.oom"] == 0


def test_a_load_takes_only_what_the_rounds_budget_funds(tiny_model_dir):
    """Loaded tokens take device pages as computed ones would: a hit in the host tier loads only
    what is left of the round's budget after the requests admitted before it, and the budget
    reads the pool again after the load (it may have evicted to pay for it)."""
    llm = tiered(tiny_model_dir, kv_tokens=256, chunk_tokens=512)
    sched, params = llm.core.scheduler, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    cold = list(range(10, 210))  # 200 tokens, computed once, then spilled to the host
    llm.generate([cold], params)
    assert sched.cache.evict(sched.cache.evictable_size(), reason="test") >= 200
    first = sched.add_request(
        list(range(220, 300)) * 2, params
    )  # 160 tokens, no hit: first in line
    second = sched.add_request(cold + [5, 6], params)  # a 200-token hit, all on the host
    while sched.has_work():
        sched.step()
    r = llm.core.receipts
    admits = {a["rid"]: a for a in r.of("admission.admit")}
    load = next(x for x in r.of("tier.load") if x["rid"] == second.rid)
    room = 256 - 160 - admits[second.rid]["decode_reserve"]
    assert 0 < load["tokens"] <= room  # only what the round could fund
    assert not r.of("alloc.relief") and not r.of("alloc.oom")  # admission never over-planned
    assert first.finish_reason == second.finish_reason == "length"


def test_the_shipped_windows_read_a_tiered_engines_receipts(tiny_model_dir, tmp_path):
    """A spill is an eviction: eviction_honesty holds for it (a pass that only sheds host-backed
    copies is held to what it can reach), and nothing is lost or left unended."""
    from tests.integration.test_audit_engine import audit_log, overall

    log = tmp_path / "boot.jsonl"
    llm = tiered(tiny_model_dir, log_file=str(log))
    chats(llm, 300)
    llm.close("test")
    got = audit_log(log, "eviction_honesty", "no_request_lost", "boot_health")
    for window in ("eviction_honesty", "no_request_lost", "boot_health"):
        assert overall(got[window]) == "PASS", got[window]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_spill_and_load_back_through_pinned_host_memory_change_no_token(tiny_model_dir):
    roomy = LLM(model=tiny_model_dir, device="cuda", kv_tokens=8192, check_invariants=True)
    expected = chats(roomy, 300)
    llm = tiered(tiny_model_dir, device="cuda")
    assert llm.core.host_tier.kv.layers[0].k.is_pinned()
    assert chats(llm, 300) == expected
    kinds = Counter(x["event"] for x in llm.core.receipts.records)
    assert kinds["tier.spill"] > 0 and kinds["tier.load"] > 0, kinds
    # unset on CUDA, the tier is sized from host memory (and the cgroup, where one limits)
    sized = LLM(model=tiny_model_dir, device="cuda", kv_tokens=256).core.receipts.of("tier.sized")
    assert sized[0]["path"] == "measured" and sized[0]["host_kv_tokens"] > 0
