"""One tensor-parallel rank of the tiny model, for tests/unit/test_tp_shard.py.

A spawned child imports its target by module name, so the rank's body lives here rather than
in the test module. ``greedy_run`` is shared with the parent, which runs the same batch at one
rank: the two sides differ only in the model's ``comm``.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any

import numpy as np
import torch

from engine.group.comm import Comm, TorchComm, local_init_method
from engine.memory.kv_pool import KVPool
from engine.memory.req_table import ReqToTokenPool
from engine.model.llama import LlamaModel
from engine.model.loader import load_model
from engine.model.runner import BatchEntry, ModelRunner
from kernels.select import get_backend

PROMPTS = [
    [0, 5, 17, 42, 99, 300, 7],
    [0, 250, 3],
    [0, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21],
]
STEPS = 6
# "tied": the tiny model as written (vocab 320 splits evenly in two). "untied": a vocabulary
# of 319 (the last rank's shard is padded) and a separate LM head.
# "alone": the tied model decoding one request, so every product has one row (padded to two by
# `linear`, a view the all-reduce must not read as contiguous).
VARIANTS = ("tied", "untied", "alone")


def prompts_of(variant: str) -> list[list[int]]:
    return PROMPTS[:1] if variant == "alone" else PROMPTS


def build_model(path: str, variant: str, comm: Comm) -> LlamaModel:
    loaded = load_model(path)
    cfg, w = loaded.config, dict(loaded.weights)
    if variant == "untied":
        vocab = cfg.vocab_size - 1
        cfg = dataclasses.replace(cfg, vocab_size=vocab, tie_word_embeddings=False)
        embed = w["model.embed_tokens.weight"][:vocab]
        w["model.embed_tokens.weight"] = embed
        w["lm_head.weight"] = embed.flip(0) * 1.5  # not the embedding, so the head is its own
    backend = get_backend("torch", "cpu", torch.float32, 1)
    return LlamaModel(cfg, w, torch.float32, backend, comm=comm)


def greedy_run(
    model: LlamaModel, prompts: list[list[int]] = PROMPTS
) -> tuple[np.ndarray, list[list[int]]]:
    """A batched prefill of ``prompts``, then ``STEPS`` batched greedy decode steps. Returns
    the logits of every step, ``[STEPS + 1, len(prompts), vocab]``, and the tokens chosen."""
    cfg = model.cfg
    width = max(len(p) for p in prompts) + STEPS
    slots = 1 + len(prompts) * width  # slot 0 is the allocator's padding slot
    kv = KVPool(cfg.num_layers, slots, model.local_kv_heads, cfg.head_dim, model.dtype)
    table = ReqToTokenPool(len(prompts), width)
    runner = ModelRunner(model, kv, table)
    rows = [table.alloc() for _ in prompts]
    lens = [0] * len(prompts)

    def entry(i: int, ids: list[int]) -> BatchEntry:
        start = 1 + i * width + lens[i]
        out = torch.arange(start, start + len(ids))
        table.write(rows[i], lens[i], out)
        e = BatchEntry(rows[i], lens[i], ids, out)
        lens[i] += len(ids)
        return e

    steps = [runner.forward([entry(i, p) for i, p in enumerate(prompts)])]
    tokens: list[list[int]] = [[] for _ in prompts]
    for _ in range(STEPS):
        nxt = steps[-1].argmax(-1).tolist()
        for i, t in enumerate(nxt):
            tokens[i].append(t)
        steps.append(runner.forward([entry(i, [t]) for i, t in enumerate(nxt)]))
    return torch.stack(steps).numpy(), tokens


def run_rank(rank: int, world: int, path: str, port: int, queue: Any) -> None:
    """Every variant at this rank; puts ``(rank, {variant: (logits, tokens, heads)})`` or
    ``(rank, traceback text)`` on ``queue``."""
    torch.set_num_threads(1)
    comm = None
    try:
        comm = TorchComm(rank, world, local_init_method(port), 30.0)
        out = {}
        for variant in VARIANTS:
            model = build_model(path, variant, comm)
            logits, tokens = greedy_run(model, prompts_of(variant))
            out[variant] = (logits, tokens, (model.local_heads, model.local_kv_heads))
        queue.put((rank, out))
    except BaseException:
        queue.put((rank, traceback.format_exc()))
    finally:
        if comm is not None:
            comm.close()
