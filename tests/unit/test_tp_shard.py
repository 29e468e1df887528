"""Tensor-parallel sharding: which heads and rows each rank holds (pure), and a real group of two
processes over gloo whose logits match the one-rank model's."""

from __future__ import annotations

import queue as queue_mod
import socket
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from engine.group.comm import Comm
from engine.model.shard import cols, kv_head_range, plan_shard, rows, vocab_rows
from tests import tp_worker
from tests.tiny_model import make_tiny_model


def test_heads_mlp_and_vocab_split_contiguously():
    a, b = (plan_shard(32, 8, 11008, 32001, 2, r) for r in (0, 1))
    assert (a.heads, b.heads) == (range(0, 16), range(16, 32))
    assert (a.kv_heads, b.kv_heads) == (range(0, 4), range(4, 8))
    assert (a.inter, b.inter) == (range(0, 5504), range(5504, 11008))
    # ceil(32001 / 2) rows each: the last shard runs one row past the vocabulary
    assert (a.vocab, b.vocab) == (range(0, 16001), range(16001, 32002))


def test_one_rank_holds_everything():
    s = plan_shard(9, 3, 100, 320, 1, 0)
    assert (s.heads, s.kv_heads, s.inter, s.vocab) == (range(9), range(3), range(100), range(320))


@pytest.mark.parametrize(
    ("heads", "kv", "inter", "world", "message"),
    [
        (9, 3, 96, 2, "tp 2 does not divide the model's 9 attention heads"),
        (9, 3, 96, 4, "tp 4 does not divide the model's 9 attention heads"),
        (8, 4, 96, 3, "tp 3 does not divide the model's 8 attention heads"),
        (12, 4, 96, 6, "tp 6 neither divides the model's 4 KV heads nor is a multiple of them"),
        (8, 2, 100, 8, "tp 8 does not divide the model's 100 intermediate size"),
    ],
)
def test_refused_splits_name_the_numbers(heads, kv, inter, world, message):
    with pytest.raises(ValueError, match=message):
        plan_shard(heads, kv, inter, 320, world, 0)


def test_nine_heads_three_kv_heads_at_tp3():
    shards = [plan_shard(9, 3, 96, 320, 3, r) for r in range(3)]
    assert [s.heads for s in shards] == [range(0, 3), range(3, 6), range(6, 9)]
    assert [s.kv_heads for s in shards] == [range(0, 1), range(1, 2), range(2, 3)]


def test_more_ranks_than_kv_heads_replicates_each_kv_head_for_its_query_group():
    # 9 heads, 3 KV heads: KV head j serves query heads 3j..3j+2; at tp 9 rank r holds query
    # head r, so it needs KV head r // 3
    shards = [plan_shard(9, 3, 99, 320, 9, r) for r in range(9)]
    assert [s.heads for s in shards] == [range(r, r + 1) for r in range(9)]
    assert [s.kv_heads.start for s in shards] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all(len(s.kv_heads) == 1 for s in shards)
    assert [kv_head_range(2, 8, r).start for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_slices_take_the_heads_rows_and_pad_the_vocabulary():
    w = torch.arange(6 * 4 * 2, dtype=torch.float32).reshape(6 * 4, 2)  # 6 heads of dim 4
    assert torch.equal(rows(w, range(2, 4), 4), w[8:16])
    assert torch.equal(cols(w.t(), range(1, 3), 4), w.t()[:, 4:12])
    table = torch.arange(5 * 3, dtype=torch.float32).reshape(5, 3)
    last = vocab_rows(table, plan_shard(2, 2, 2, 5, 2, 1).vocab)  # rows 3, 4 and a padding row
    assert torch.equal(last, torch.cat([table[3:5], torch.zeros(1, 3)]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(path: str, world: int, timeout: float) -> dict[int, object]:
    """Each rank's result; a rank that hangs or dies fails the test instead of wedging it."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=tp_worker.run_rank, args=(r, world, path, port, q), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            try:
                rank, out = q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue_mod.Empty:
                pytest.fail(f"the group of {world} answered {sorted(results)} in {timeout} s")
            results[rank] = out
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
    return results


def test_two_ranks_match_one_rank(tmp_path):
    path = str(make_tiny_model(tmp_path / "tiny"))
    results = run_group(path, 2, timeout=300.0)  # two fresh processes import torch
    for rank, out in results.items():
        assert isinstance(out, dict), f"rank {rank} failed:\n{out}"
    for variant in tp_worker.VARIANTS:
        model = tp_worker.build_model(path, variant, Comm())
        assert (model.local_heads, model.local_kv_heads) == (4, 2)
        want_logits, want_tokens = tp_worker.greedy_run(model, tp_worker.prompts_of(variant))
        for rank in (0, 1):
            logits, tokens, local = results[rank][variant]
            assert local == (2, 1)  # 4 heads and 2 KV heads split in two
            assert (
                logits.shape
                == want_logits.shape
                == (tp_worker.STEPS + 1, len(tp_worker.prompts_of(variant)), model.cfg.vocab_size)
            )
            diff = float(np.abs(logits - want_logits).max())
            print(f"{variant} rank {rank}: max |logit tp2 - tp1| = {diff:.3g}")
            assert tokens == want_tokens
            assert diff < 1e-3
        # every rank samples from the same numbers, bit for bit
        assert np.array_equal(results[0][variant][0], results[1][variant][0])
