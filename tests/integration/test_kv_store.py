"""The durable KV store under the engine: cached prefixes written as they leave memory (eviction,
the host tier's drops) and at a clean stop, loaded back on a hit the memory above misses, in this
boot and after a restart, with greedy tokens identical to a run without the store; both ledgers
balance after every step (check mode)."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from engine.tiers.store_files import page_path

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def prompts(vocab: int, count: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(length)] for _ in range(count)]


def stored(tmp_path, model, **kw) -> LLM:
    return LLM(model=model, check_invariants=True, kv_store_dir=str(tmp_path / "store"), **kw)


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_prefix_evicted_to_the_store_loads_back_with_the_same_tokens(
    tiny_model_dir, tmp_path, page_size
):
    first, others = prompts(300, 1, 120), prompts(300, 4, 120, seed=1)
    plain = LLM(model=tiny_model_dir, kv_tokens=4096, page_size=page_size, prefix_cache=False)
    expected = [o.token_ids for o in plain.generate(first + others + first, GREEDY)]
    llm = stored(tmp_path, tiny_model_dir, kv_tokens=256, page_size=page_size)
    got = [o.token_ids for o in llm.generate(first, GREEDY)]
    got += [o.token_ids for o in llm.generate(others, GREEDY)]  # the first prompt's KV leaves
    got += [o.token_ids for o in llm.generate(first, GREEDY)]
    assert got == expected
    r = llm.core.receipts
    writes = [w for w in r.of("store.write") if w["reason"] == "evict"]
    assert sum(w["pages"] for w in writes) > 0 and all("error" not in w for w in writes)
    last = r.of("request.finish")[-1]  # the first prompt again
    (load,) = [x for x in r.of("store.load") if x["rid"] == last["rid"]]
    assert load["tokens"] >= 100 and load["bytes"] == load["tokens"] * llm.core.kv.bytes_per_token
    assert last["cached"] >= load["tokens"]  # the hit counts what came from the store
    llm.close()


def test_a_conversation_outlives_a_restart(tiny_model_dir, tmp_path):
    history = prompts(300, 1, 200)[0]
    plain = LLM(model=tiny_model_dir, kv_tokens=4096, prefix_cache=False)
    answer = plain.generate([history], GREEDY)[0].token_ids
    turn2 = history + answer + [7, 8, 9, 10]
    expected = plain.generate([turn2], GREEDY)[0].token_ids
    llm = stored(tmp_path, tiny_model_dir, kv_tokens=2048)
    assert llm.generate([history], GREEDY)[0].token_ids == answer
    llm.close()  # a clean stop writes what is cached
    r = llm.core.receipts
    assert sum(w["pages"] for w in r.of("store.write") if w["reason"] == "stop") > 0
    again = stored(tmp_path, tiny_model_dir, kv_tokens=2048)
    (scan,) = again.core.receipts.of("store.scan")
    assert scan["pages"] * 16 >= 192 and scan["reaped"] == {}  # store pages of 16 tokens
    assert again.generate([turn2], GREEDY)[0].token_ids == expected
    (load,) = [x for x in again.core.receipts.of("store.load") if x["pages"]]
    assert load["tokens"] >= 192  # the history's whole store pages, not recomputed
    again.close()


def test_another_models_store_is_read_by_nobody_and_says_why(tiny_model_dir, tmp_path):
    llm = stored(tmp_path, tiny_model_dir, kv_tokens=1024)
    llm.generate(prompts(300, 1, 40), GREEDY)
    llm.close()
    other = stored(tmp_path, tiny_model_dir, kv_tokens=1024, page_size=4)  # other KV pages
    (sized,) = other.core.receipts.of("store.sized")
    assert sized["path"] == "unusable" and "another model" in sized["reason"]
    assert other.core.receipts.of("store.scan") == []
    other.close()


def test_a_corrupt_page_is_set_aside_and_the_prompt_computed(tiny_model_dir, tmp_path):
    history = prompts(300, 1, 64)[0]
    llm = stored(tmp_path, tiny_model_dir, kv_tokens=1024)
    want = llm.generate([history + [5, 6]], GREEDY)[0].token_ids
    llm.close()
    again = stored(tmp_path, tiny_model_dir, kv_tokens=1024)
    store = again.core.scheduler.cache.keeper.store
    keys = again.core.scheduler.cache.keeper.page_keys(history)
    path = page_path(store.root, keys[2])  # the third store page (tokens 32 to 48)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x55
    path.write_bytes(bytes(data))
    assert again.generate([history + [5, 6]], GREEDY)[0].token_ids == want
    (load,) = [x for x in again.core.receipts.of("store.load") if x["asked"]]
    assert load["pages"] == 2 and "checksum" in load["error"]
    (q,) = again.core.receipts.of("store.quarantine")
    assert (q["path"], q["reason"]) == (str(path.relative_to(store.root)), "checksum")
    assert (store.root / q["moved_to"]).read_bytes() == bytes(data)  # moved, never deleted
    again.close()


def test_the_host_tiers_drops_go_to_the_store_and_come_back(tiny_model_dir, tmp_path):
    """Device pool, host tier and store: what the host tier drops is written, then loaded."""
    from tests.integration.test_host_tier import chats

    roomy = LLM(model=tiny_model_dir, kv_tokens=8192)
    expected = chats(roomy, 300)
    llm = stored(tmp_path, tiny_model_dir, kv_tokens=256, host_kv_tokens=256)
    assert chats(llm, 300) == expected
    r = llm.core.receipts
    drops = [w for w in r.of("store.write") if w["reason"] == "tier_drop"]
    assert sum(w["pages"] for w in drops) > 0
    assert sum(x["pages"] for x in r.of("store.load")) > 0
    llm.close()


def test_checkpoints_pin_share_survive_a_restart_and_refuse_with_numbers(tiny_model_dir, tmp_path):
    """A checkpoint pins its conversation's pages; a branch that extends it pins only its new
    pages; pinned pages outlive eviction pressure and a restart; one over the pin budget is
    refused with the four numbers and changes nothing."""
    from engine.tiers.checkpoints import CheckpointError

    history = prompts(300, 1, 160)[0]
    kw = dict(kv_tokens=512, page_size=16, kv_store_pin_bytes=300_000)
    llm = stored(tmp_path, tiny_model_dir, **kw)
    root = llm.checkpoint(history, id="root")
    assert root["tokens"] == 160 and root["pinned_bytes"] > 0 and root["shared_bytes"] == 0
    extra = list(range(3, 19))  # one more page
    branch = llm.checkpoint(history + extra, id="branch")
    assert branch["shared_bytes"] == root["pinned_bytes"]  # the parent's pages, shared
    assert 0 < branch["pinned_bytes"] < root["pinned_bytes"]  # only the new page
    store = llm.core.scheduler.cache.keeper.store
    before = store.capacity()
    with pytest.raises(CheckpointError) as refused:
        llm.checkpoint(prompts(300, 1, 400, seed=9)[0], id="big")
    assert refused.value.status == 409
    f = refused.value.fields
    assert f["overshoot"] == f["held"] + f["want"] - f["budget"] > 0
    assert store.capacity()["pinned"] == before["pinned"] and "big" not in store.checkpoints
    (r,) = llm.core.receipts.of("checkpoint.refuse")
    assert (r["want"], r["held"], r["budget"], r["overshoot"]) == (
        f["want"],
        f["held"],
        f["budget"],
        f["overshoot"],
    )
    store.evict(store.used, reason="test")  # everything unpinned goes
    assert all(store.has(k) for k in store.checkpoints["root"].keys)
    llm.close()
    again = stored(tmp_path, tiny_model_dir, **kw)
    assert {c["id"] for c in again.checkpoints()["data"]} == {"root", "branch"}
    turn = history + extra + [7, 8]
    plain = LLM(model=tiny_model_dir, kv_tokens=4096, prefix_cache=False)
    assert (
        again.generate([turn], GREEDY)[0].token_ids == plain.generate([turn], GREEDY)[0].token_ids
    )
    (load,) = [x for x in again.core.receipts.of("store.load") if x["pages"]]
    assert load["tokens"] == 176  # the branch's whole prompt, from the store
    assert again.delete_checkpoint("root")["deleted"]
    assert all(
        again.core.scheduler.cache.keeper.store.entries[k].pins == 1
        for k in again.core.scheduler.cache.keeper.page_keys(history)
    )  # the branch's pin
    with pytest.raises(CheckpointError) as gone:
        again.delete_checkpoint("root")
    assert gone.value.status == 404
    again.close()


def test_a_checkpoint_without_a_store_or_with_a_bad_id_is_a_clear_error(tiny_model_dir, tmp_path):
    from engine.tiers.checkpoints import CheckpointError

    with pytest.raises(CheckpointError, match="--kv-store-dir") as none:
        LLM(model=tiny_model_dir, kv_tokens=512).checkpoint([1, 2, 3, 4])
    assert none.value.status == 400
    llm = stored(tmp_path, tiny_model_dir, kv_tokens=512)
    with pytest.raises(CheckpointError, match="id") as bad:
        llm.checkpoint([1, 2, 3, 4], id="../etc")
    assert bad.value.status == 400
    llm.close()


ENGINE_WRITER = """
import random, sys
from engine import LLM, SamplingParams
model, store, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
llm = LLM(model=model, kv_tokens=128, page_size=4, kv_store_dir=store)
rng = random.Random(seed)
params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
for i in range(10000):
    prompt = [rng.randrange(2, 300) for _ in range(rng.randint(20, 100))]
    if i % 3 == 0:
        made = llm.checkpoint(prompt, id=f"s{seed}-{i}")
        print("checkpoint", made["id"], flush=True)
    else:
        llm.generate([prompt], params)
        print("generated", i, flush=True)
"""


def test_an_engine_killed_mid_write_again_and_again_loses_no_checkpoint(tiny_model_dir, tmp_path):
    """SIGKILL an engine whose evictions write pages and which makes checkpoints, three times:
    each next boot's scan reaps what a kill cut, keeps every checkpoint the engine answered,
    and every page it keeps reads back whole (its checksum holds)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    store = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    answered: set[str] = set()
    for seed in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", ENGINE_WRITER, tiny_model_dir, str(store), str(seed)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert proc.stdout is not None
        for _ in range(10 + 4 * seed):
            line = proc.stdout.readline().split()
            if line[0] == "checkpoint":
                answered.add(line[1])
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        llm = stored(tmp_path, tiny_model_dir, kv_tokens=128, page_size=4)
        keeper = llm.core.scheduler.cache.keeper
        assert answered <= set(keeper.store.checkpoints)
        keys = list(keeper.store.entries)
        assert len(keeper.store.read(keys)) == len(keys)  # in the index's order: all whole
        assert all("error" not in r for r in llm.core.receipts.of("store.load"))
        assert all(keeper.store.has(k) for cp in keeper.store.checkpoints.values() for k in cp.keys)
        llm.core.receipts.close()  # no clean stop: the next writer finds the store as it was


def test_a_load_that_begins_inside_a_store_page_copies_only_its_tail(tiny_model_dir, tmp_path):
    """A prompt whose first 40 tokens are cached on the device and the rest only in the store
    (pages of 16 tokens): the load starts in the page that holds token 40 and copies from there;
    tokens equal a run without the store."""
    a = prompts(300, 1, 120)[0]
    b = a[:40] + prompts(300, 1, 60, seed=5)[0]
    others = prompts(300, 4, 120, seed=1)
    plain = LLM(model=tiny_model_dir, kv_tokens=4096, prefix_cache=False)
    want = [o.token_ids for o in plain.generate([a, *others, b, a], GREEDY)]
    llm = stored(tmp_path, tiny_model_dir, kv_tokens=256)
    got = [llm.generate([p], GREEDY)[0].token_ids for p in [a, *others, b, a]]
    assert got == want
    r = llm.core.receipts
    last = r.of("request.finish")[-1]
    (load,) = [x for x in r.of("store.load") if x["rid"] == last["rid"]]
    admit = [x for x in r.of("admission.admit") if x["rid"] == last["rid"]][0]
    # the device held b's first 40 tokens (a's too); the store the rest of a's whole pages
    assert admit["prefix_hit"] == 112 and load["pages"] == 5  # pages 2..6: tokens 32 to 112
    llm.close()


def test_a_full_disk_fails_writes_as_outcomes_and_serving_goes_on(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Every page write fails (ENOSPC, after the eviction it makes and its one retry):
    eviction still pays, each write says the disk is full in its receipt, and every request is
    answered with the tokens of a run without a store."""
    import errno

    from engine.tiers.store_fs import StoreFS

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    first, others = prompts(300, 1, 120), prompts(300, 4, 120, seed=1)
    plain = LLM(model=tiny_model_dir, kv_tokens=4096, prefix_cache=False)
    want = [o.token_ids for o in plain.generate(first + others + first, GREEDY)]
    llm = stored(tmp_path, tiny_model_dir, kv_tokens=256)
    monkeypatch.setattr(StoreFS, "write_atomic", full)
    got = [llm.generate([p], GREEDY)[0].token_ids for p in first + others + first]
    assert got == want
    writes = llm.core.receipts.of("store.write")
    assert writes and all(
        w["pages"] == 0 and "disk under the store is full" in w["error"] for w in writes
    )
    assert llm.core.scheduler.cache.keeper.store.entries == {}  # no page half-counted
    llm.close()


def test_a_store_directory_that_cannot_be_made_is_said_and_the_engine_serves(
    tiny_model_dir, tmp_path
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    llm = LLM(model=tiny_model_dir, kv_tokens=512, kv_store_dir=str(blocker / "store"))
    (sized,) = llm.core.receipts.of("store.sized")
    assert sized["path"] == "unusable" and "cannot use" in sized["reason"]
    assert llm.core.scheduler.cache.keeper is None
    assert llm.generate(prompts(300, 1, 20), GREEDY)[0].token_ids
    llm.close()


def test_an_unwritable_store_directory_is_said_at_boot_and_by_the_checkpoints(
    tiny_model_dir, tmp_path, monkeypatch
):
    """The directory exists but nothing can be written in it (EACCES, as a read-only mount or
    another user's directory answers; root is not stopped by a mode): store.sized unusable with
    the reason, kept for /health (EngineInfo.store_off) and answered by the checkpoints (503
    naming the directory and the reason, not "start it with --kv-store-dir")."""
    import errno

    from engine.tiers.checkpoints import CheckpointError
    from engine.tiers.store_fs import StoreFS

    def denied(*_a, **_k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(StoreFS, "write_atomic", denied)
    where = tmp_path / "store"
    llm = LLM(model=tiny_model_dir, kv_tokens=512, kv_store_dir=str(where))
    (sized,) = llm.core.receipts.of("store.sized")
    assert sized["path"] == "unusable" and "PermissionError" in sized["reason"]
    assert llm.core.info().store_off == sized["reason"]
    with pytest.raises(CheckpointError) as e:
        llm.checkpoints()
    assert e.value.status == 503 and str(where) in str(e.value)
    assert "Permission denied" in str(e.value) and "start it with" not in str(e.value)
    llm.close()


@pytest.mark.parametrize("write", ["back", "second_hit"])
def test_second_hit_writes_a_reused_prefix_at_once_so_a_crash_keeps_it(
    tiny_model_dir, tmp_path, write
):
    """Two prompts sharing 96 tokens, then the engine dies without a clean stop: with
    second_hit the shared prefix was written at its reuse and the next boot loads it; with
    back (nothing evicted, no stop) the store holds nothing."""
    shared = prompts(300, 1, 96)[0]
    a, b = shared + [5, 6, 7], shared + [8, 9, 10]
    llm = stored(tmp_path, tiny_model_dir, kv_tokens=1024, kv_store_write=write)
    llm.generate([a], GREEDY)
    assert llm.core.receipts.of("store.write") == []  # a first use writes nothing
    llm.generate([b], GREEDY)
    hits = [w for w in llm.core.receipts.of("store.write") if w["reason"] == "hit"]
    llm.core.receipts.close()  # no clean stop: nothing is flushed
    again = stored(tmp_path, tiny_model_dir, kv_tokens=1024, kv_store_write=write)
    again.generate([shared + [11, 12]], GREEDY)
    loaded = sum(x["tokens"] for x in again.core.receipts.of("store.load"))
    if write == "second_hit":
        assert sum(w["pages"] for w in hits) == 6 and loaded == 96
    else:
        assert hits == [] and loaded == 0
    again.close()


def test_a_weights_cutover_retires_the_store_so_no_old_kv_is_read(tiny_model_dir, tmp_path):
    """The store holds KV the old weights computed: after a weights cutover it is neither read
    nor written (store.sized off, saying why), and the new weights compute every prompt."""
    from tests.tiny_model import make_tiny_model

    other = str(make_tiny_model(tmp_path / "other", seed=7))
    prompt = prompts(300, 1, 96)[0]
    want = LLM(model=other, kv_tokens=1024, prefix_cache=False).generate([prompt], GREEDY)
    llm = stored(tmp_path, tiny_model_dir, kv_tokens=1024)
    llm.generate([prompt], GREEDY)
    llm.generate([prompt + [3]], GREEDY)  # reused: written to the store (second_hit)
    assert any(w["pages"] for w in llm.core.receipts.of("store.write"))
    end = llm.cutover("weights", "carry", path=other)
    assert end["outcome"] == "ok", end
    loads = len(llm.core.receipts.of("store.load"))
    assert llm.generate([prompt], GREEDY)[0].token_ids == want[0].token_ids
    assert len(llm.core.receipts.of("store.load")) == loads  # nothing read after the cutover
    off = llm.core.receipts.of("store.sized")[-1]
    assert off["path"] == "off" and "weights" in off["reason"]
    llm.close()


def test_a_store_load_under_a_host_part_not_loaded_is_refused_loudly(tiny_model_dir, tmp_path):
    """The store goes on below the host tier only: a match whose host part is still on the host
    (its load ended short) is a caller's mistake, not a silent no-op."""
    from engine.memory.radix import MatchResult

    llm = stored(tmp_path, tiny_model_dir, kv_tokens=256)
    cache = llm.core.scheduler.cache
    tokens = prompts(300, 1, 40)[0]
    match = cache.match_prefix(tokens)
    short = MatchResult(match.slots, match.node, 8, match.node)
    with pytest.raises(ValueError, match="host"):
        cache.keeper.load(cache, tokens, short, 64, None)
    llm.close()


def test_a_checkpoint_on_a_full_disk_is_refused_as_a_full_disk(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Every store write fails with ENOSPC (after the room eviction makes and one retry): the
    checkpoint's 507 says the disk is full, with its free bytes, never "no room under its cap"
    (the cap had room)."""
    import errno

    from engine.tiers.checkpoints import CheckpointError
    from engine.tiers.store_fs import StoreFS

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    llm = stored(tmp_path, tiny_model_dir, kv_tokens=1024)
    monkeypatch.setattr(StoreFS, "write_atomic", full)
    with pytest.raises(CheckpointError) as e:
        llm.checkpoint(prompts(300, 1, 64)[0], id="c")
    assert e.value.status == 507
    message = str(e.value)
    assert "disk under the store is full" in message and "cap" not in message, message
    assert e.value.fields["used"] < e.value.fields["cap"] and "disk_free" in e.value.fields
    llm.close()
