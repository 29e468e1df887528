"""Memory pressure changes nothing but timing: the same greedy tokens from a pool that holds
about three requests at once as from an unconstrained one, with the relief mechanisms actually
engaged (asserted from the receipts, never assumed). Invariants are checked after every step
(check mode): the ledger, counter honesty, request states, the running ceiling."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from engine import LLM, SamplingParams
from tests.conftest import requires_default_model


def workload(vocab: int, n: int = 32, seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, vocab) for _ in range(rng.randint(4, 120))] for _ in range(n)]
    params = [
        SamplingParams(max_tokens=rng.randint(8, 60), temperature=0, ignore_eos=True)
        for _ in prompts
    ]
    return prompts, params


def three_at_once(prompts, params) -> int:
    need = sorted(len(p) + q.max_tokens for p, q in zip(prompts, params))
    return sum(need[-3:])


def roomy_and_tight(model, prompts, params, **tight):
    """The same workload on an unconstrained engine and on one whose pool holds ~3 requests."""
    tight = {"chunk_tokens": 32, "max_running": 8, **tight}
    roomy = LLM(
        model=model,
        kv_tokens=16384,
        chunk_tokens=4096,
        page_size=tight.get("page_size", 1),
        check_invariants=True,
    )
    expected = [o.token_ids for o in roomy.generate(prompts, params)]
    llm = LLM(model=model, kv_tokens=three_at_once(prompts, params), check_invariants=True, **tight)
    got = [o.token_ids for o in llm.generate(prompts, params)]
    return expected, got, llm


def assert_engaged_and_complete(receipts, n_requests: int, ladder: bool = True) -> Counter:
    """Every request finished, and pressure engaged what pays for it: with the relief ladder its
    rungs (a chunk that would park retracts decoders instead), without it admission's floor
    (parks) and decode funding's retractions."""
    kinds = Counter(r["event"] for r in receipts.records)
    assert kinds["request.finish"] == n_requests and kinds["request.abort"] == 0
    paid = ("relief.engage", "relief.rung") if ladder else ("admission.park", "admission.unpark")
    for kind in ("retract", "requeue", "eviction", "admission.defer", *paid):
        assert kinds[kind] > 0, f"pressure never engaged {kind}: {dict(kinds)}"
    sites = {r.get("site") for r in receipts.of("retract")}
    assert ("park" in sites) == ladder, sites
    retracted = [rid for r in receipts.of("retract") for rid in r["rids"]]
    requeued = [r["rid"] for r in receipts.of("requeue")]
    assert sorted(retracted) == sorted(requeued)  # every retracted request was put back
    finished = {r["rid"] for r in receipts.of("request.finish")}
    assert set(retracted) <= finished  # ... and finished
    assert not receipts.of("invariant.violation")
    assert not receipts.of("alloc.oom")
    return kinds


@pytest.mark.parametrize("ladder", [True, False], ids=["ladder", "no-ladder"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_pressure_changes_nothing_but_timing(tiny_model_dir, page_size, ladder):
    prompts, params = workload(300)
    expected, got, tight = roomy_and_tight(
        tiny_model_dir, prompts, params, page_size=page_size, relief_ladder=ladder
    )
    assert got == expected
    assert_engaged_and_complete(tight.core.receipts, len(prompts), ladder)
    # retracted requests finished with their full length, not cut short
    assert [len(t) for t in got] == [p.max_tokens for p in params]


def test_seeded_sampling_survives_retraction(tiny_model_dir):
    prompts, params = workload(300, n=16, seed=3)
    params = [
        SamplingParams(max_tokens=p.max_tokens, temperature=0.9, top_k=20, seed=i, ignore_eos=True)
        for i, p in enumerate(params)
    ]
    expected, got, tight = roomy_and_tight(tiny_model_dir, prompts, params)
    assert got == expected
    assert tight.core.receipts.of("retract")


def test_running_never_exceeds_max_running_plus_one(tiny_model_dir):
    prompts, params = workload(300, n=20, seed=5)
    llm = LLM(
        model=tiny_model_dir, kv_tokens=8192, max_running=3, chunk_tokens=16, check_invariants=True
    )
    sched = llm.core.scheduler
    reqs = [sched.add_request(p, q) for p, q in zip(prompts, params)]
    peak = 0
    while sched.has_work():
        sched.step()
        peak = max(peak, len(sched.running))
    assert peak == 3 + 1  # the ceiling was reached, and only by the one in-flight chunk
    assert all(r.finish_reason == "length" for r in reqs)


def test_a_request_that_cannot_fit_alone_is_aborted_with_the_numbers(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, kv_tokens=64, check_invariants=True)
    out = llm.generate([[5] * 40], SamplingParams(max_tokens=100, temperature=0, ignore_eos=True))[
        0
    ]
    # the pool holds the prompt and 24 generated tokens' K/V; the 25th token has none yet
    assert out.finish_reason == "abort" and len(out.token_ids) == 64 - 40 + 1
    abort = llm.core.receipts.of("request.abort")[0]
    assert abort["reason"] == "exceeds_pool" and abort["tokens"] == 25
    assert abort["need"] == 65 and abort["capacity"] == 64  # the numbers behind the decision
    # the engine goes on serving afterwards
    assert (
        llm.generate([[5, 6]], SamplingParams(max_tokens=3, ignore_eos=True))[0].finish_reason
        == "length"
    )


def test_a_prompt_that_can_never_fit_is_refused_with_a_receipt(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, kv_tokens=64, check_invariants=True)
    with pytest.raises(ValueError, match="the KV pool holds 64"):
        llm.generate([[5] * 64], SamplingParams(max_tokens=4))
    (reject,) = llm.core.receipts.of("request.reject")
    assert reject["reason"] == "exceeds_pool"
    assert reject["need"] == 65 and reject["capacity"] == 64
    assert llm.core.receipts.of("request.received") == []  # refused, never taken in


@pytest.mark.slow
@requires_default_model
def test_default_model_pressure_changes_nothing_but_timing():
    prompts, params = workload(49152, n=32, seed=1)
    expected, got, tight = roomy_and_tight(None, prompts, params)
    assert got == expected
    assert_engaged_and_complete(tight.core.receipts, len(prompts))
