"""The attention interface every backend implements.

A forward pass runs a *flat* batch: the new tokens of every request laid end to end. For request
``i`` the batch holds ``extend_lens[i]`` new tokens at positions ``[prefix_lens[i],
prefix_lens[i] + extend_lens[i])``; its whole context (cached prefix then new tokens) lives in the
KV pool at the slots ``req_to_token[req_rows[i], :prefix_lens[i] + extend_lens[i]]``.

* extend: new tokens attend causally to themselves and fully to their cached prefix.
* decode: the special case ``extend_lens == 1`` for every request.

Backends first store the new tokens' K/V into ``out_slots`` of the layer's pool, then attend by
reading K/V through the slot table, so a prefix computed by an earlier forward (or another
request, through the prefix cache) is read, never recomputed.

This module is the interface alone: the backends import it, so it imports none of them; which
backend runs is decided in ``kernels.select``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Per-batch metadata, built once per forward and shared by every layer."""

    req_to_token: torch.Tensor  # [rows, max_context] int64: slot of each token of each row
    req_rows: list[int]  # the req_to_token row of each request in the batch
    prefix_lens: list[int]  # tokens already in the pool before this forward, per request
    extend_lens: list[int]  # new tokens in this forward, per request
    positions: torch.Tensor  # [T] int64, position of each new token
    out_slots: torch.Tensor  # [T] int64, the pool slot each new token's K/V is written to
    # what a backend derives once per forward and reuses in every layer (index tables, masks)
    scratch: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.extend_lens)

    def validate(self) -> None:
        """Catch a malformed batch before a kernel reads out of bounds."""
        n = len(self.req_rows)
        if not (len(self.prefix_lens) == len(self.extend_lens) == n):
            raise ValueError(
                "req_rows, prefix_lens and extend_lens must have one entry per request"
            )
        total = sum(self.extend_lens)
        if total != self.num_tokens or total != int(self.out_slots.shape[0]):
            raise ValueError(
                f"extend_lens sum to {total} but positions has {self.num_tokens} "
                f"and out_slots {int(self.out_slots.shape[0])} tokens"
            )
        width = int(self.req_to_token.shape[1])
        for p, e in zip(self.prefix_lens, self.extend_lens):
            if p < 0 or e < 1 or p + e > width:
                raise ValueError(f"request context {p}+{e} outside the slot table width {width}")


@dataclass(slots=True)
class LayerKV:
    """One layer's K and V pools: ``[slots, kv_heads, head_dim]`` each."""

    k: torch.Tensor
    v: torch.Tensor


@dataclass(slots=True)
class GraphDecode:
    """A backend's decode plan at fixed addresses, for a batch of a fixed number of rows over a
    slot table of fixed width: what a captured CUDA graph reads in every layer, so a replay
    needs no new tensor. The runner puts ``plan`` in ``meta.scratch[key]`` (where the backend
    looks its per-forward plan up) and calls ``update`` with the step's host-side metadata
    before each run: the backend's own host work (a page table planned into its fixed
    buffers), never captured. ``update`` is None where the runner's static buffers say all."""

    key: str
    plan: object
    update: Callable[[AttentionMetadata], None] | None = None


@dataclass(frozen=True, slots=True)
class HeadShape:
    """A model's attention as a backend's choices read it: this rank's query and KV heads, the
    head size, the activations' dtype and the KV pool's."""

    heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    kv_dtype: torch.dtype


class AttentionBackend(ABC):
    """Computes attention for a flat batch over a paged KV pool.

    What a backend must do with the pool:

    * write the new tokens' K/V, cast to the pool's dtype, to ``kv.k[out_slots]`` and
      ``kv.v[out_slots]`` before it attends, and write no other slot (the rest belong to other
      requests and to the prefix cache);
    * read a request's context only through its slot table row, slots
      ``req_to_token[req_rows[i], :prefix_lens[i] + extend_lens[i]]``: any other slot may hold
      another request's K/V, or garbage;
    * return ``[T, heads, head_dim]`` in ``q``'s dtype, where the row of a new token depends only
      on its query and on the K/V at its own request's positions ``<=`` its own.

    What it may assume about its arguments:

    * ``meta`` passed ``validate()``: one entry per request, ``extend_lens`` summing to ``T``,
      every context inside the slot table's width;
    * request ``i``'s new tokens are contiguous in the flat batch, in request order, at positions
      ``prefix_lens[i] ..``;
    * ``heads`` is a multiple of ``kv_heads`` (grouped-query attention);
    * the same ``meta`` is passed to every layer of one forward, unchanged, so what a backend
      derives from it once may be kept in ``meta.scratch`` (under a key of its own) and reused.
    """

    name: str = "abstract"

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, heads, head_dim]
        k: torch.Tensor,  # [T, kv_heads, head_dim]
        v: torch.Tensor,  # [T, kv_heads, head_dim]
        kv: LayerKV,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, heads, head_dim]
        ...

    def graph_decode(
        self,
        rows: int,
        width: int,
        heads: int,
        kv: LayerKV,
        scale: float,
        q_dtype: torch.dtype,
        context_lens: torch.Tensor,
    ) -> GraphDecode | None:
        """The fixed-address decode plan for ``rows`` requests of at most ``width`` tokens,
        reading each one's context length from ``context_lens`` (the runner's static buffer,
        ``[rows]``; its slot table is ``req_to_token`` ``[rows, width]``, row ``i`` for request
        ``i``); None where this backend's decode cannot run at fixed addresses (it derives
        Python-sized shapes from each batch), so a CUDA graph cannot replay it."""
        return None

    def prepare(self, shape: HeadShape) -> None:
        """Choose among this backend's ways for a model of these shapes, at boot, where it
        times them on this machine (the torch backend's prefill kernel); nothing where it has
        one way."""
        return None

    def kernels(self, shape: HeadShape) -> dict[str, Any] | None:
        """Which kernels attend a model of these shapes, decode and extend, where the backend
        chooses among several by shape (``boot.weights``' ``attention``); None where it has
        one way."""
        return None


def store_kv(k: torch.Tensor, v: torch.Tensor, kv: LayerKV, out_slots: torch.Tensor) -> None:
    """``kv.k[out_slots[t]] = k[t]`` (and V), cast to the pool's dtype."""
    kv.k.index_copy_(0, out_slots, k.to(kv.k.dtype))
    kv.v.index_copy_(0, out_slots, v.to(kv.v.dtype))
