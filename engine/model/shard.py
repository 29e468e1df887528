"""Which rows and columns of each weight one tensor-parallel rank holds (Megatron-style).

A layer's column-parallel matrices (fused QKV, fused gate/up) are cut by output rows, so each
rank computes its own heads and its own slice of the MLP with no communication; the
row-parallel ones (``o_proj``, ``down_proj``) are cut by input columns to match, and their
partial products are summed over the ranks afterwards. The embedding and the LM head are cut
by vocabulary rows. Everything here is a pure function of the config's numbers and the rank;
the slices are views, so the caller casts and moves only what this rank keeps.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.group.pipeline import stage_layers
from engine.model.config import ModelConfig


class TPShard(NamedTuple):
    """One rank's share of the model. Ranges index heads, MLP rows and vocabulary rows."""

    rank: int
    world: int
    heads: range  # query heads
    kv_heads: range  # KV heads (one replicated head when world > num_kv_heads)
    inter: range  # rows of gate and of up; columns of down
    vocab: range  # embedding / LM head rows; may run past the vocabulary (zero padding)


def _divides(world: int, n: int, what: str) -> None:
    if n % world:
        raise ValueError(f"tp {world} does not divide the model's {n} {what}")


def kv_head_range(num_kv_heads: int, world: int, rank: int) -> range:
    """This rank's KV heads. When ``world`` divides them, each rank takes its contiguous
    share. When ``world`` is a multiple of them, there are fewer KV heads than ranks, so each
    is replicated on ``world // num_kv_heads`` consecutive ranks: those are exactly the ranks
    whose query heads form that KV head's group. Anything else would split a group across
    ranks that do not hold its KV head, so it is refused."""
    if num_kv_heads % world == 0:
        per = num_kv_heads // world
        return range(rank * per, (rank + 1) * per)
    if world % num_kv_heads == 0:
        head = rank // (world // num_kv_heads)
        return range(head, head + 1)
    raise ValueError(
        f"tp {world} neither divides the model's {num_kv_heads} KV heads nor is a multiple of them"
    )


def plan_shard(
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    vocab_size: int,
    world: int,
    rank: int,
) -> TPShard:
    """Rank ``rank``'s share of ``world``, or a ValueError naming the number that does not
    split. The vocabulary need not divide: each rank holds ``ceil(vocab / world)`` rows so all
    shards have one shape (an all-gather needs equal parts), the last one padded with zeros."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a group of {world}")
    _divides(world, num_heads, "attention heads")
    kv = kv_head_range(num_kv_heads, world, rank)
    _divides(world, intermediate_size, "intermediate size")
    heads, inter = num_heads // world, intermediate_size // world
    vocab = -(-vocab_size // world)
    return TPShard(
        rank=rank,
        world=world,
        heads=range(rank * heads, (rank + 1) * heads),
        kv_heads=kv,
        inter=range(rank * inter, (rank + 1) * inter),
        vocab=range(rank * vocab, (rank + 1) * vocab),
    )


def rows(w: torch.Tensor, part: range, width: int = 1) -> torch.Tensor:
    """Output rows of a column-parallel matrix: ``part`` counted in blocks of ``width`` rows
    (a head is ``head_dim`` rows of Q, K or V; an MLP row is one row of gate or of up)."""
    return w[part.start * width : part.stop * width]


def cols(w: torch.Tensor, part: range, width: int = 1) -> torch.Tensor:
    """Input columns of a row-parallel matrix (``o_proj``, ``down_proj``), the ones that read
    the outputs ``rows`` gave this rank."""
    return w[:, part.start * width : part.stop * width]


def vocab_rows(w: torch.Tensor, rows: range) -> torch.Tensor:
    """Rows ``rows`` of a ``[vocab, hidden]`` table; rows past the vocabulary are zeros, so a
    padded row's logit is 0 (trimmed after the gather) and no id ever looks one up."""
    part = w[rows.start : rows.stop]
    short = len(rows) - part.shape[0]
    if short == 0:
        return part
    return torch.cat([part, part.new_zeros(short, w.shape[1])])


def check_layout(cfg: ModelConfig, tp: int, pp: int) -> None:
    """``cfg`` (a model config) fits ``tp`` shards x ``pp`` stages: its heads, MLP and vocabulary
    divide by ``tp`` and it has at least ``pp`` layers; else a ValueError naming the numbers."""
    plan_shard(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size, cfg.vocab_size, tp, 0)
    stage_layers(cfg.num_layers, pp, 0)
