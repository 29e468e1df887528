"""The scheduler core over real memory: every request ends, nothing leaks, the ledger balances
after every step (check mode), and the idle-time check reports a broken ledger once."""

from __future__ import annotations

import os
import random

import pytest

from engine import LLM, SamplingParams


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_random_workload_under_a_tight_pool_balances_every_step(tiny_model_dir, page_size):
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=256,
        page_size=page_size,
        max_running=6,
        chunk_tokens=48,
        check_invariants=True,
    )
    rng = random.Random(page_size)
    prompts = [[rng.randrange(2, 300) for _ in range(rng.randint(1, 90))] for _ in range(24)]
    params = [
        SamplingParams(
            max_tokens=rng.randint(1, 40), temperature=rng.choice([0, 0.8]), seed=i, ignore_eos=True
        )
        for i in range(len(prompts))
    ]
    outs = llm.generate(prompts, params)
    assert [len(o.token_ids) for o in outs] == [p.max_tokens for p in params]
    core = llm.core
    # what finished requests computed stays cached for reuse, all of it evictable
    cache = core.scheduler.cache
    assert cache.protected_size() == 0
    assert core.allocator.available_size() + cache.evictable_size() == core.allocator.capacity
    assert core.req_table.available_rows() == core.req_table.rows
    assert not core.receipts.of("invariant.violation")


def test_batched_greedy_equals_alone(tiny_model_dir):
    """Continuous batching and chunked prefill change nothing about a greedy request's tokens."""
    prompts = [[5, 6, 7] * k for k in (1, 7, 20)]
    p = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    batched = LLM(model=tiny_model_dir, kv_tokens=512, chunk_tokens=16, check_invariants=True)
    together = [o.token_ids for o in batched.generate(prompts, p)]
    alone = [batched.generate([q], p)[0].token_ids for q in prompts]
    assert together == alone


def test_idle_check_reports_a_broken_ledger_once(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, kv_tokens=64)
    llm.generate([[3, 4, 5]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert not llm.core.receipts.of("invariant.violation")
    llm.core.allocator._free.pop()  # a page vanishes from the free list: the ledger is short
    for _ in range(2):
        llm.generate([[3, 4, 5]], SamplingParams(max_tokens=2, ignore_eos=True))
    got = llm.core.receipts.of("invariant.violation")
    assert [r["what"] for r in got] == ["ledger", "allocator"]  # once per kind, not per check
    ledger = got[0]
    assert ledger["free"] + ledger["private"] + ledger["cached"] + ledger["staged"] == 63


def test_boot_receipts_name_the_pool_sizing_path(tiny_model_dir, tmp_path):
    import orjson

    from engine.core import heap

    log = tmp_path / "boot.jsonl"
    llm = LLM(model=tiny_model_dir, kv_tokens=100, page_size=16, log_file=str(log))
    llm.core.receipts.close()
    lines = [orjson.loads(x) for x in log.read_bytes().splitlines()]
    events = ["boot.start", "boot.weights", "boot.pool_sized", "tier.sized", "store.sized"]
    events += ["notice", "boot.ready"]
    assert [r["event"] for r in lines] == events  # the notice names the relief ladder's rungs
    assert lines[1]["mode"] == "exact" and lines[1]["dtype"] == "float32"
    sized = lines[2]
    assert sized["path"] == "configured" and sized["kv_tokens"] == 96 and sized["page_size"] == 16
    # and what the C heap does with what a step frees (engine/core/heap.py; the environment's
    # ATTEST_HEAP=system leaves glibc's own)
    kept = heap._glibc() is not None and (
        heap._kept or os.environ.get("ATTEST_HEAP", "").strip() != "system"
    )
    assert sized["heap"] == ("keep" if kept else "system")
    assert lines[3]["path"] == "off" and lines[3]["host_kv_tokens"] == 0  # no host tier on CPU
    assert [r["seq"] for r in lines] == [1, 2, 3, 4, 5, 6, 7]
    assert lines[4]["path"] == "off" and lines[4]["reason"] == "no kv_store_dir"
    measured = LLM(model=tiny_model_dir, kv_memory_fraction=0.001).core
    m = measured.receipts.of("boot.pool_sized")[0]
    assert m["path"] == "measured" and m["mem_available"] > 0
    assert m["kv_tokens"] == m["budget_bytes"] // m["bytes_per_token"]


def test_every_model_built_gives_back_what_its_load_freed(tiny_model_dir, monkeypatch):
    """The boot's model and a weights cutover's alike (engine.core.heap: the kept heap would hold
    the load's temporaries): the file's copies let go, then the heap's free pages given back."""
    from engine.core import engine_core
    from engine.model.loader import load_model

    calls: list[int] = []
    monkeypatch.setattr(engine_core, "give_back", lambda: calls.append(1))
    llm = LLM(model=tiny_model_dir, kv_tokens=64)
    assert calls == [1] and llm.core.loaded.weights == {}
    loaded = load_model(tiny_model_dir)
    assert loaded.weights
    llm.core.build_model(loaded)  # a weights cutover builds its model so
    assert calls == [1, 1] and loaded.weights == {}
    llm.close()
