"""The allocation-site net (law 5): the one way the scheduler takes KV memory.

An allocation that fails is not an error yet: flush the staged frees, evict from the prefix
cache and ask the relief ladder once (the ladder first when rungs are registered), then retry
the very same call. Only when the retry fails
too does the original error surface, with the numbers at the raise. Every step of the net is a
receipt. The net is rank-local by contract: the group has already committed to this batch, so
nothing here may take a collective.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.mem.allocator import TokenAllocator
from engine.mem.radix import RadixCache
from engine.mem.req_table import ReqToTokenPool
from engine.obs import schema
from engine.obs.receipts import Receipts
from engine.sched.relief import ReliefRegistry
from engine.sched.request import Request


class KVPoolExhausted(RuntimeError):
    """An allocation failed after the whole net (flush, evict, relief, retry)."""


class AllocationNet:
    def __init__(
        self,
        allocator: TokenAllocator,
        cache: RadixCache,
        req_table: ReqToTokenPool,
        relief: ReliefRegistry,
        receipts: Receipts,
    ) -> None:
        self.allocator = allocator
        self.cache = cache
        self.req_table = req_table
        self.relief = relief
        self.receipts = receipts

    def alloc(self, req: Request, n: int, site: str) -> torch.Tensor:
        """Slots for ``n`` new tokens of ``req``, written into its row of the table."""
        # the last slot matters only when the last page has room (never with page_size 1)
        partial = req.kv_len % self.allocator.page_size
        last = int(self.req_table.table[req.row, req.kv_len - 1]) if partial else None

        def call() -> torch.Tensor | None:
            return self.allocator.alloc_extend(req.kv_len, n, last)

        slots = call()
        if slots is None:
            need = self.allocator.fresh_slots(req.kv_len, n)
            slots = self.catch(call, need, site, req.rid)
        self.req_table.write(req.row, req.kv_len, slots)
        return slots

    def catch(
        self, call: Callable[[], torch.Tensor | None], need: int, site: str, rid: str
    ) -> torch.Tensor:
        """Flush staged frees, evict, one relief, one retry of the same call, then raise."""
        r, alloc = self.receipts, self.allocator
        staged = alloc.staged_size()
        if staged:
            freed = alloc.flush_free_group()
            r.emit(schema.ALLOC_FLUSH, need=need, staged=staged, freed=freed, site=site, rid=rid)
        short = need - alloc.available_size()
        if short > 0:
            # with rungs registered the ladder goes first (its first rung is eviction) and the
            # cache's own eviction pays what is still short; without, eviction and then the
            # empty registry, which says so once
            ladder = self.relief.serves("alloc_net")
            relieved = self.relief.relieve(short, "alloc_net", rid) if ladder else 0
            short = need - alloc.available_size()
            evicted = self.cache.evict(short, reason="alloc_net", rid=rid) if short > 0 else 0
            short = need - alloc.available_size()
            if short > 0 and not ladder:
                self.relief.relieve(short, "alloc_net", rid)
            r.emit(
                schema.ALLOC_RELIEF, need=need, freed=evicted + relieved, evicted=evicted,
                relieved=relieved, site=site, rid=rid,
            )  # fmt: skip
        slots = call()  # the retry is the same call as the first attempt
        r.emit(schema.ALLOC_RETRY, need=need, ok=slots is not None, site=site, rid=rid)
        if slots is None:
            numbers = dict(
                need=need, available=alloc.available_size(), staged=alloc.staged_size(),
                evictable=self.cache.evictable_size(), capacity=alloc.capacity,
            )  # fmt: skip
            r.emit(schema.ALLOC_OOM, site=site, rid=rid, **numbers)
            raise KVPoolExhausted(
                f"KV pool cannot fund {need} tokens for {rid} at {site}: "
                + ", ".join(f"{k} {v}" for k, v in numbers.items())
            )
        return slots
