"""One owner for a request's KV memory, pinned by a run: every call that changes the device
structures (the allocator, the request table, the radix cache, the host tier under it, the
durable store below) is made by the memory authority (``engine/scheduler/memory.py`` and the
holdings it owns, ``holdings.py``), never by admission or the scheduler; admission calls them
not even to read (it asks the authority for numbers).

Who called is read from the call stack as the run makes the calls: the first frame outside the
structures themselves (``engine/memory``, ``engine/tiers``: an eviction that frees pages, a
load that evicts, is its caller's work). The workload reaches every kind of memory work a
step does: prefixes claimed and locked, loads from the host tier and the store, starts,
parks, retractions, ends, the rejected drafts' KV given back, the step's group of frees."""

from __future__ import annotations

import inspect
import random
import sys
from collections import Counter
from pathlib import Path

import engine
from engine import LLM, SamplingParams

ROOT = Path(engine.__file__).resolve().parents[1]  # where the engine is imported from
STRUCTURES = ("engine/memory/", "engine/tiers/")
AUTHORITY = {"engine/scheduler/memory.py", "engine/scheduler/holdings.py"}

# What each structure answers without changing anything; every other public method is work.
READS = {
    "allocator": {
        "available_size",
        "staged_size",
        "used_size",
        "fresh_slots",
        "pages_needed",
        "check",
        "page_map",
        "slot_map",
    },
    "req_table": {"available_rows", "slots"},
    "cache": {"evictable_size", "protected_size", "total_size", "shape", "check"},
    "tier": {"capacity", "used_size", "check"},
    "keeper": {"page_keys"},
}


def watch(monkeypatch, calls: Counter, label: str, obj: object) -> None:
    """Every public method of ``obj`` counted by (label, method, caller) as it is called."""
    for name in dir(obj):
        method = getattr(obj, name) if not name.startswith("_") else None
        if inspect.ismethod(method):
            monkeypatch.setattr(obj, name, counting(calls, label, name, method))


def counting(calls: Counter, label: str, name: str, method):
    def counted(*args, **kwargs):
        calls[(label, name, caller())] += 1
        return method(*args, **kwargs)

    return counted


COUNTED = counting(Counter(), "", "", print).__code__


def caller() -> str:
    """The file of the first frame above the structures (relative to the engine's root; the
    counting wrappers are passed over like the structures they wrap)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        if not where.startswith(STRUCTURES) and frame.f_code is not COUNTED:
            return where
        frame = frame.f_back
    return "?"


def chats(llm: LLM, vocab: int = 300) -> None:
    """Seven chats sharing a system prompt, three turns each (a turn's prompt is the history)."""
    rng = random.Random(0)
    shared = [rng.randrange(2, vocab) for _ in range(64)]
    history = [
        shared + [rng.randrange(2, vocab) for _ in range(rng.randint(5, 40))] for _ in "1234567"
    ]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    for _ in range(3):
        outs = llm.generate(history, params)
        history = [
            h + o.token_ids + [rng.randrange(2, vocab) for _ in range(rng.randint(4, 30))]
            for h, o in zip(history, outs)
        ]


def test_only_the_memory_authority_changes_memory(tiny_model_dir, tmp_path, monkeypatch):
    llm = LLM(
        model=tiny_model_dir,
        check_invariants=True,
        kv_tokens=200,  # tight: parks, retractions, spills and loads
        page_size=4,
        max_running=6,
        chunk_tokens=32,
        host_kv_tokens=256,  # small: what it drops goes to the store, and comes back from there
        kv_store_dir=str(tmp_path / "store"),
        speculative="suffix",
    )
    sched = llm.core.scheduler
    memory, calls = sched.memory, Counter()
    structures = {
        "allocator": memory.allocator,
        "req_table": memory.req_table,
        "cache": memory.cache,
        "tier": memory.cache.tier,
        "keeper": memory.cache.keeper,
    }
    for label, obj in structures.items():
        watch(monkeypatch, calls, label, obj)
    chats(llm)

    work = {(label, name, who) for label, name, who in calls if name not in READS[label]}
    assert {who for _, _, who in work} <= AUTHORITY, sorted(
        w for w in work if w[2] not in AUTHORITY
    )
    asked = {who for _, _, who in calls}
    assert "engine/scheduler/admitter.py" not in asked  # admission asks the authority only

    # the run reached every kind of memory work, each where its owner does it
    holdings = {(label, name) for label, name, who in work if who.endswith("holdings.py")}
    assert {
        ("cache", "match_prefix"),  # a prefix claimed and locked
        ("cache", "inc_lock_ref"),
        ("cache", "dec_lock_ref"),  # let go (a deferred request) or released
        ("tier", "load"),  # a hit carried on from the host tier ...
        ("keeper", "load"),  # ... and from the store
        ("req_table", "alloc"),  # a start
        ("req_table", "write"),
        ("req_table", "free"),  # a release
        ("cache", "insert"),
        ("allocator", "free"),  # a partial page, a rejected draft's page
    } <= holdings
    made = {(label, name) for label, name, who in work if who.endswith("memory.py")}
    assert {
        ("allocator", "free_group_begin"),  # the step's frees, staged together
        ("allocator", "free_group_end"),
        ("allocator", "alloc_extend"),  # the net
        ("cache", "evict"),  # the ladder
    } <= made
    r = llm.core.receipts
    assert r.of("retract") and r.of("admission.park") and r.of("tier.load") and r.of("store.load")
    assert sum(i.get("spec_proposed", 0) for i in r.of("iteration")) > 0
    assert not r.of("invariant.violation")
