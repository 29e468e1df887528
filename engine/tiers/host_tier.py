"""HostTier: a second home for cached prefix KV, in host memory.

The radix cache builds its tier (``RadixCache(..., tier=...)``: a factory handed the cache).
Under pressure the radix cache spills cold device-only nodes here instead of dropping them
(``RadixCache.evict`` hands them to ``spill``); a prefix hit that ends in host-only nodes loads
their KV back into fresh device pages before the request's extend (``load``). The tier has its
own allocator and its own ledger line: ``free + used == capacity``, ``used`` being the host slots
the tree's nodes hold. To make room it drops its least recently used copies: the host copy of a
node that is on the device too, or a host-only leaf nobody holds.

Copies are synchronous: a spilled node's device pages are freed only after its copy is done, and
a loaded node joins the device counters only once its KV is there, so nothing in flight is ever
counted as available. Every move is a receipt: ``tier.spill``, ``tier.load``, ``tier.drop``.
"""

from __future__ import annotations

import heapq
import time

import torch

from engine.memory.allocator import TokenAllocator
from engine.memory.kv_pool import KVPool
from engine.memory.radix import MatchResult, RadixCache, TreeNode
from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.tiers.host_sizing import HostSizing, size_host_pool


def copy_kv(src: KVPool, src_slots: torch.Tensor, dst: KVPool, dst_slots: torch.Tensor) -> None:
    """K and V of ``src_slots`` in every layer of ``src`` into ``dst_slots`` of ``dst``."""
    s = src_slots.to(src.layers[0].k.device)
    d = dst_slots.to(dst.layers[0].k.device)
    for a, b in zip(src.layers, dst.layers, strict=True):
        b.k.index_copy_(0, d, a.k.index_select(0, s).to(b.k.device))
        b.v.index_copy_(0, d, a.v.index_select(0, s).to(b.v.device))
    if d.device.type == "cuda" or s.device.type == "cuda":
        torch.cuda.synchronize()  # the copy is done before its source pages can be reused


class HostTier:
    def __init__(
        self, cache: RadixCache, device_kv: KVPool, capacity: int, receipts: Receipts
    ) -> None:
        self.cache = cache
        self.device_kv = device_kv
        self.alloc = TokenAllocator(capacity, cache.page_size)
        _, heads, dim = device_kv.layers[0].k.shape
        pin = device_kv.layers[0].k.device.type == "cuda"  # pinned pages copy at full speed
        self.kv = KVPool(
            len(device_kv.layers), self.alloc.pool_slots, heads, dim, device_kv.dtype, pin=pin
        )
        self.bytes_per_token = device_kv.bytes_per_token
        self.receipts = receipts
        self.nodes: set[TreeNode] = set()  # the nodes that hold host slots
        # totals since boot, for benchmarks: tokens moved and seconds spent moving them
        self.moved = {"spill_tokens": 0, "spill_s": 0.0, "load_tokens": 0, "load_s": 0.0}

    @property
    def capacity(self) -> int:
        return self.alloc.capacity

    def used_size(self) -> int:
        """Host tokens the tree's nodes hold (the ledger's ``used`` term)."""
        return sum(len(n.key) for n in self.nodes)

    def adopt(self, node: TreeNode) -> None:
        """A split made ``node`` out of a host-resident one: it holds host slots too."""
        self.nodes.add(node)

    # -- device -> host -----------------------------------------------------------------------

    def spill(self, victims: list[tuple[TreeNode, torch.Tensor]], rid: str | None) -> int:
        """Copy the victims' KV (device-only nodes the cache let go, with their device slots)
        here and free their device pages. A node the tier cannot hold is dropped with what
        hangs below it. Returns the tokens spilled."""
        t0 = time.perf_counter()
        need = sum(int(s.numel()) for _, s in victims)
        self.make_room(need, reason="spill")
        placed: list[tuple[TreeNode, torch.Tensor]] = []
        dropped, error = 0, None
        forgot = [0, 0]  # host copies spilled before that went with a node this spill dropped
        for node, slots in reversed(victims):  # parents before their children
            got = None if node.parent is None else self.alloc.alloc(int(slots.numel()))
            if got is None:  # no room, or already gone with a dropped parent
                dropped += int(slots.numel())
                if node.parent is not None:
                    self._drop_subtree(node, forgot)
                self.cache.allocator.free(slots)
                continue
            node.host = got
            self.nodes.add(node)
            placed.append((node, slots))
        if placed:
            dev = torch.cat([s for _, s in placed])
            try:
                copy_kv(self.device_kv, dev, self.kv, torch.cat([n.host for n, _ in placed]))
            except Exception as e:  # a spill that cannot copy drops instead: eviction still pays
                error = f"{type(e).__name__}: {e}"
                dropped += int(dev.numel())
                fresh = {node for node, _ in placed}  # their host slots held nothing yet
                for node in fresh:
                    self._free_host(node)
                for node, _ in placed:
                    if node.parent is not None:
                        self._drop_subtree(node, forgot)
                placed = []
            self.cache.allocator.free(dev)
        if forgot[0]:
            self.receipts.emit(
                schema.TIER_DROP,
                reason="spill_failed",
                tokens=forgot[0],
                nodes=forgot[1],
                need=need,
                host_free=self.alloc.available_size(),
            )
        tokens = sum(len(n.key) for n, _ in placed)
        seconds = time.perf_counter() - t0
        self.moved["spill_tokens"] += tokens
        self.moved["spill_s"] += seconds
        self.receipts.emit(
            schema.TIER_SPILL,
            tokens=tokens,
            bytes=tokens * self.bytes_per_token,
            seconds=round(seconds, 6),
            nodes=len(placed),
            dropped=dropped,
            rid=rid,
            host_free=self.alloc.available_size(),
            **({"error": error} if error else {}),
        )
        return tokens

    def make_room(self, need: int, reason: str) -> int:
        """Drop LRU host copies until ``need`` host tokens are free (or nothing more can go).
        Returns the host tokens dropped."""
        short = need - self.alloc.available_size()
        if short <= 0:
            return 0
        heap = [(n.last_access, n.id, n) for n in self.nodes if self._droppable(n)]
        heapq.heapify(heap)
        dropped = nodes = 0
        while dropped < short and heap:
            _, _, node = heapq.heappop(heap)
            if not self._droppable(node):
                continue
            parent = node.parent
            keeper = self.cache.keeper
            if node.value is None and keeper is not None:  # its last copy: to the store first
                keeper.keep(self.cache, node, self.kv, node.host, "tier_drop")
            dropped += self._free_host(node)
            nodes += 1
            if node.value is None:  # host-only: it leaves the tree
                self.cache.detach(node)
                if parent is not None and self._droppable(parent):
                    heapq.heappush(heap, (parent.last_access, parent.id, parent))
        self.receipts.emit(
            schema.TIER_DROP,
            reason=reason,
            tokens=dropped,
            nodes=nodes,
            need=need,
            host_free=self.alloc.available_size(),
        )
        return dropped

    def _droppable(self, node: TreeNode) -> bool:
        """A host copy that can go: one of a node also on the device, or a host-only leaf that
        no request holds (one being loaded is locked)."""
        if node.host is None or node.parent is None:
            return False
        return node.value is not None or (not node.children and node.lock_ref == 0)

    def _free_host(self, node: TreeNode) -> int:
        size = len(node.key)
        self.alloc.free(node.host)
        node.host = None
        self.nodes.discard(node)
        return size

    def _drop_subtree(self, node: TreeNode, forgot: list[int]) -> None:
        """Take ``node`` out of the tree with everything below it (host-only nodes, or victims
        of the same spill whose device slots the caller frees); the host copies it frees are
        added to ``forgot`` (tokens, nodes), for their receipt."""
        self.cache.detach(node)
        stack = [node]
        while stack:
            n = stack.pop()
            if n.host is not None:
                forgot[0] += self._free_host(n)
                forgot[1] += 1
            for c in n.children.values():
                c.parent = None  # gone with its parent: a later victim of this spill sees it
                stack.append(c)

    def clear(self) -> None:
        """Drop every host copy and every host-only node (a cold start for benchmarks)."""
        held = list(self.nodes)
        tokens = sum(self._free_host(n) for n in held)
        for n in held:
            if n.value is None and n.parent is not None:
                top = n.parent is self.cache.root or n.parent.value is not None
                if top:
                    self.cache.detach(n)
        self.receipts.emit(
            schema.TIER_DROP,
            reason="reset",
            tokens=tokens,
            nodes=len(held),
            need=0,
            host_free=self.alloc.available_size(),
        )

    # -- host -> device -----------------------------------------------------------------------

    def load(self, match: MatchResult, limit: int, rid: str | None) -> MatchResult:
        """Load the host tail of ``match`` into fresh device pages, top down, at most ``limit``
        tokens (whole pages), evicting to fund them. The caller holds a lock on ``match.node``
        (none when it is the root) and holds one on the returned match's node instead."""
        cache, ps = self.cache, self.cache.page_size
        want = min(match.host_len, limit)
        want -= want % ps
        if want <= 0 or match.host_node is None:
            return match
        t0 = time.perf_counter()
        cache.inc_lock_ref(match.host_node)  # nothing on the path goes while it is loaded
        try:
            short = want - cache.allocator.available_size()
            if short > 0:
                cache.evict(short, reason="load", rid=rid)
            avail = cache.allocator.available_size()
            nodes = self._path(match, min(want, avail - avail % ps))
            total = sum(len(n.key) for n in nodes)
            slots = cache.allocator.alloc(total) if total else None
            if slots is None:
                return match
            try:
                copy_kv(self.kv, torch.cat([n.host for n in nodes]), self.device_kv, slots)
            except Exception as e:  # the hit stays on the host; the request computes instead
                cache.allocator.free(slots)
                self.receipts.emit(
                    schema.TIER_LOAD,
                    tokens=0,
                    bytes=0,
                    seconds=0.0,
                    rid=rid,
                    asked=match.host_len,
                    error=f"{type(e).__name__}: {e}",
                )
                return match
            at = 0
            for n in nodes:
                cache.adopt_device(n, slots[at : at + len(n.key)])
                at += len(n.key)
            cache.inc_lock_ref(nodes[-1])  # the caller's lock moves to the new end
            cache.dec_lock_ref(match.node)
        finally:
            cache.dec_lock_ref(match.host_node)
        seconds = time.perf_counter() - t0
        self.moved["load_tokens"] += total
        self.moved["load_s"] += seconds
        self.receipts.emit(
            schema.TIER_LOAD,
            tokens=total,
            bytes=total * self.bytes_per_token,
            seconds=round(seconds, 6),
            nodes=len(nodes),
            rid=rid,
            asked=match.host_len,
        )
        host_node = None if total == match.host_len else match.host_node
        prefix = torch.cat([match.slots, slots])
        return MatchResult(prefix, nodes[-1], match.host_len - total, host_node)

    def _path(self, match: MatchResult, tokens: int) -> list[TreeNode]:
        """The host-only nodes below ``match.node``, top down, covering ``tokens`` (the last one
        split so they end exactly there)."""
        path, n = [], match.host_node
        while n is not None and n is not match.node:
            path.append(n)
            n = n.parent
        out, got = [], 0
        for node in reversed(path):
            if got >= tokens:
                break
            if got + len(node.key) > tokens:
                node = self.cache._split(node, tokens - got)  # the upper part is loaded
            out.append(node)
            got += len(node.key)
        return out

    # -- checking -----------------------------------------------------------------------------

    def check(self) -> None:
        """The tier's own books: its allocator balances, and the nodes it counts are exactly
        the tree's nodes with host slots; raises AssertionError."""
        self.alloc.check()
        in_tree, stack = set(), [self.cache.root]
        while stack:
            node = stack.pop()
            for c in node.children.values():
                if c.host is not None:
                    in_tree.add(c)
                stack.append(c)
        if in_tree != self.nodes:
            raise AssertionError(
                f"host tier: counts {len(self.nodes)} nodes, the tree has {len(in_tree)} with "
                f"host slots ({len(self.nodes - in_tree)} gone from the tree)"
            )


def size_host_tier(
    host_kv_tokens: int | None,
    device: str,
    device_kv: KVPool,
    allocator: TokenAllocator,
    prefix_cache: bool,
    receipts: Receipts,
) -> int:
    """The host tier's size in tokens (``tier.sized`` says how); 0 when it is off (always
    without a prefix cache: the tier holds cached prefixes only)."""
    sizing = size_host_pool(
        host_kv_tokens,
        device,
        device_kv.bytes_per_token,
        allocator.page_size,
        device_tokens=allocator.capacity,
    )
    if sizing.host_kv_tokens and not prefix_cache:
        sizing = HostSizing("off", 0, sizing.bytes_per_token, sizing.page_size, "no prefix cache")
    receipts.emit(schema.TIER_SIZED, **sizing.as_fields())
    return sizing.host_kv_tokens
