"""RadixCache: a prefix tree of token ids whose nodes own the KV slots of those tokens.

* Keys are page-aligned: a node's key length is a multiple of ``page_size``, so a cached
  prefix is always whole pages and can be shared without copying.
* Where KV lives: on the device (``value``: pool slots), in the host tier (``host``), or both.
  Device nodes hang only below device nodes, so a match is a device prefix and then a host
  tail, which the host tier loads back before a request extends it (``host_tier.py``).
* Lock refs: a running request locks the node its prefix ends at; ``inc_lock_ref`` and
  ``dec_lock_ref`` walk to the root, and a split copies the lock onto the new upper node, so
  ``lock_ref(parent) >= lock_ref(child)`` holds on every edge. Hence an unlocked node has no
  locked descendant and peeling unlocked device leaves reaches every unlocked device token.
* Counters count device tokens: ``evictable_size()`` is those of unlocked nodes, so
  ``evict(evictable_size())`` frees exactly that: the counter never promises what eviction
  cannot pay. ``protected_size()`` is those of locked nodes.
* Eviction frees LRU unlocked device leaves through the allocator (whose open free group may
  stage them): a node with a host copy sheds its device one, a device-only node is spilled to
  the host tier when one is attached and dropped otherwise; the ``eviction`` receipt says so.

Ownership: ``insert(tokens, slots)`` hands the cache the slots of the page-aligned part of
``tokens``; slots that duplicate tokens already cached (with other slots) are freed by the cache;
over tokens whose KV is only on the host they become those nodes' device copy.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch

from engine.memory import radix_walk
from engine.memory.allocator import TokenAllocator
from engine.memory.kv_pool import KVPool
from engine.observability.receipts import Receipts


class TreeNode:
    __slots__ = ("key", "value", "host", "children", "parent", "lock_ref", "last_access", "id")

    def __init__(
        self,
        nid: int,
        key: list[int],
        value: torch.Tensor | None,
        parent: TreeNode | None,
        host: torch.Tensor | None = None,
    ) -> None:
        self.id = nid
        self.key = key
        self.value = value  # device slots, len(value) == len(key); None: not on the device
        self.host = host  # host-tier slots, len(host) == len(key); None: not on the host
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = time.monotonic()

    def __repr__(self) -> str:
        where = "device" if self.host is None else ("host" if self.value is None else "both")
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock={self.lock_ref}, children={len(self.children)}, kv={where})"


class MatchResult(NamedTuple):
    slots: torch.Tensor  # device slots of the matched prefix, page-aligned
    node: TreeNode  # the deepest device node of the match (the root when none matched)
    host_len: int = 0  # tokens matched past ``node`` whose KV is only in the host tier
    host_node: TreeNode | None = None  # the node that host part ends at

    @property
    def length(self) -> int:
        return int(self.slots.numel())


def _common_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _cut(t: torch.Tensor | None, n: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return (None, None) if t is None else (t[:n], t[n:])


class Tier(Protocol):
    """What the cache and the memory authority ask of the host tier (``host_tier.HostTier``)."""

    def spill(self, victims: list[tuple[TreeNode, torch.Tensor]], rid: str | None) -> int: ...
    def adopt(self, node: TreeNode) -> None: ...
    def clear(self) -> None: ...
    def load(self, match: MatchResult, limit: int, rid: str | None) -> MatchResult: ...


class Keeper(Protocol):  # the durable store below the cache (``store_tier.StoreTier``)
    def keep(
        self, cache: RadixCache, node: TreeNode, pool: KVPool, slots: torch.Tensor, reason: str
    ) -> int: ...
    def load(
        self, cache: RadixCache, tokens: list[int], match: MatchResult, limit: int, rid: str | None
    ) -> MatchResult: ...
    def flush(self, cache: RadixCache) -> int: ...
    def hit(self, cache: RadixCache, node: TreeNode) -> int: ...


class RadixCache:
    """``tier``: builds the host tier under this cache (handed the cache); None: no tier.
    ``keeper``: the durable store, handed KV the cache and its tier drop for good, with the pool
    it is in (``kv``: the device pool)."""

    def __init__(
        self,
        allocator: TokenAllocator,
        *,
        disabled: bool = False,
        receipts: Receipts | None = None,
        tier: Callable[[RadixCache], Tier] | None = None,
        keeper: Keeper | None = None,
        kv: KVPool | None = None,
    ) -> None:
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.disabled = disabled
        self.receipts = receipts or Receipts()
        self._ids = itertools.count()
        self._tick = itertools.count()  # tie-breaker: LRU order among equal timestamps
        self.reset()
        self.keeper, self.kv = keeper, kv
        self.tier: Tier | None = tier(self) if tier is not None else None

    def reset_to_empty(self, reason: str = "reset") -> None:
        """Evict everything (locked nodes stay) and empty the host tier: for benchmarks that must
        start cold, and for a weights cutover (the cached KV belongs to the old weights)."""
        tier, self.tier = self.tier, None
        try:
            if tier is not None:
                tier.clear()
            self.evict(self.evictable_size(), reason=reason)
        finally:
            self.tier = tier

    def reset(self) -> None:
        self.root = TreeNode(next(self._ids), [], torch.empty(0, dtype=torch.int64), None)
        self.root.lock_ref = 1  # the root is never evicted
        self._evictable = 0
        self._protected = 0
        self._total = 0
        # lazy LRU heap of (last_access, tick, node); stale entries are skipped on pop
        self._heap: list[tuple[float, int, TreeNode]] = []
        self._last_stamp = -math.inf

    # -- counters (device tokens) -------------------------------------------------------------

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._total

    # -- matching -----------------------------------------------------------------------------

    def _child_key(self, key: list[int]) -> tuple[int, ...]:
        return tuple(key[: self.page_size])

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    @staticmethod
    def _has_device_child(node: TreeNode) -> bool:
        return any(c.value is not None for c in node.children.values())

    def _touch(self, node: TreeNode, now: float) -> None:
        # Stamps are strictly increasing: a heap entry is current only if its stamp is still the
        # node's, so a clock that repeats a reading (a coarse one) must not make an older entry
        # of a re-touched node pass for the newer one and invert the LRU order.
        if now <= self._last_stamp:
            now = math.nextafter(self._last_stamp, math.inf)
        self._last_stamp = now
        node.last_access = now
        if node.lock_ref == 0 and node.value is not None and not self._has_device_child(node):
            heapq.heappush(self._heap, (now, next(self._tick), node))
            self._maybe_compact()  # stale entries pile up while nothing evicts

    def match_prefix(self, tokens: list[int]) -> MatchResult:
        """The longest cached page-aligned prefix of ``tokens``: its device part, and the tail
        whose KV is only in the host tier. A match ending inside a node splits it there, so the
        returned nodes cover exactly the matched prefix."""
        empty = torch.empty(0, dtype=torch.int64)
        if self.disabled:
            return MatchResult(empty, self.root)
        key = list(tokens[: self._aligned(len(tokens))])
        node, values, now = self.root, [], time.monotonic()
        cur, host_len, host_node = self.root, 0, None
        while key:
            child = cur.children.get(self._child_key(key))
            if child is None:
                break
            n = self._aligned(_common_len(child.key, key))
            if n == 0:
                break
            if n < len(child.key):
                child = self._split(child, n)
            if child.value is None:  # from here down the KV is only on the host
                host_len, host_node = host_len + n, child
            else:
                values.append(child.value)
                node = child
            cur = child
            self._touch(child, now)
            key = key[n:]
        slots = torch.cat(values) if values else empty
        return MatchResult(slots, node, host_len, host_node)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child`` after ``n`` tokens; the new upper node takes the first ``n``."""
        (value, child.value), (host, child.host) = _cut(child.value, n), _cut(child.host, n)
        upper = TreeNode(next(self._ids), child.key[:n], value, child.parent, host)
        upper.lock_ref = child.lock_ref  # both halves are held by whoever held the whole
        upper.last_access = child.last_access
        upper.children = {self._child_key(child.key[n:]): child}
        assert child.parent is not None
        child.parent.children[self._child_key(child.key)] = upper
        child.parent = upper
        child.key = child.key[n:]
        if host is not None and self.tier is not None:
            self.tier.adopt(upper)
        return upper

    # -- insertion ----------------------------------------------------------------------------

    def insert(self, tokens: list[int], slots: torch.Tensor) -> int:
        """Cache ``tokens`` (page-aligned part) with their ``slots``; returns the tokens newly
        added. The cache owns those slots afterwards: the ones that duplicate an already cached
        prefix with different slots are freed here; over a node whose KV is only on the host
        they become its device copy."""
        n = self._aligned(min(len(tokens), int(slots.numel())))
        key, value = list(tokens[:n]), slots[:n].to(torch.int64)
        if self.disabled:
            self.allocator.free(value)
            return 0
        node, now = self.root, time.monotonic()
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            m = self._aligned(_common_len(child.key, key))
            if m < len(child.key):
                child = self._split(child, m)
            dup = value[:m]
            if child.value is None:
                self.adopt_device(child, dup)
            else:
                differs = dup != child.value
                if bool(differs.any()):
                    self.allocator.free(dup[differs])
            node = child
            self._touch(node, now)
            key, value = key[m:], value[m:]
        if not key:
            return 0
        leaf = TreeNode(next(self._ids), key, value, node)
        node.children[self._child_key(key)] = leaf
        added = len(key)
        self._total += added
        self._evictable += added  # a new node is unlocked
        self._touch(leaf, now)  # the parent, if it was a leaf, now has a stale heap entry
        return added

    def adopt_device(self, node: TreeNode, slots: torch.Tensor) -> None:
        """``slots`` become the device copy of a node whose KV was only on the host."""
        node.value = slots
        size = len(node.key)
        self._total += size
        if node.lock_ref:
            self._protected += size
        else:
            self._evictable += size

    def detach(self, node: TreeNode) -> None:
        """Take ``node`` (and what hangs below it) out of the tree."""
        assert node.parent is not None
        del node.parent.children[self._child_key(node.key)]
        node.parent = None

    # -- locks --------------------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0 and node.value is not None:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        now = time.monotonic()
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref on unlocked node {node!r}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                if node.value is not None:
                    self._evictable += len(node.key)
                    self._protected -= len(node.key)
                if not self._has_device_child(node):
                    self._touch(node, now)
            node = node.parent

    # -- eviction -----------------------------------------------------------------------------

    def _evictable_leaf(self, node: TreeNode, stamp: float) -> bool:
        return (
            node.parent is not None
            and node.lock_ref == 0
            and node.value is not None
            and not self._has_device_child(node)
            and node.last_access == stamp
            and node.parent.children.get(self._child_key(node.key)) is node
        )

    def evict(
        self,
        n: int,
        reason: str = "requested",
        *,
        host_backed_only: bool = False,
        rid: str | None = None,
    ) -> int:
        """Free at least ``n`` device tokens of LRU unlocked device leaves if that many are
        evictable; returns the tokens freed (whole nodes, so possibly more than ``n``).
        ``host_backed_only``: only nodes with a host copy, which shed the device one (no copy,
        nothing lost). ``rid``: the request waiting for the memory, named in the spill receipt."""
        # the promise this pass is held to: what the counter says, or what the shed can reach
        before = radix_walk.host_backed_reach(self) if host_backed_only else self._evictable
        staged_before = self.allocator.staged_size()
        evicted = 0
        spill: list[tuple[TreeNode, torch.Tensor]] = []
        passed: list[tuple[float, int, TreeNode]] = []
        while evicted < n and self._heap:
            entry = heapq.heappop(self._heap)
            stamp, _, node = entry
            if not self._evictable_leaf(node, stamp):
                continue  # stale: touched again, locked, grown children or already gone
            if host_backed_only and node.host is None:
                passed.append(entry)
                continue
            size = len(node.key)
            evicted += size
            self._evictable -= size
            self._total -= size
            slots, node.value, parent = node.value, None, node.parent
            if node.host is not None:  # it lives on in the host tier
                self.allocator.free(slots)
            elif self.tier is not None:
                spill.append((node, slots))  # its device pages are freed once it is copied
            else:
                if self.keeper is not None:  # written to the store before it is dropped
                    self.keeper.keep(self, node, self.kv, slots, "evict")
                self.allocator.free(slots)
                self.detach(node)
            if (
                parent is not self.root
                and parent.lock_ref == 0
                and not self._has_device_child(parent)
            ):
                heapq.heappush(self._heap, (parent.last_access, next(self._tick), parent))
        for entry in passed:
            heapq.heappush(self._heap, entry)
        after: dict[str, object] = {"evictable_after": self._evictable}
        if host_backed_only:
            after = {"scope": "host_backed", "evictable_after": radix_walk.host_backed_reach(self)}
        if self.tier is not None:
            after["spilled"] = self.tier.spill(spill, rid) if spill else 0
        self._maybe_compact()
        if n > 0:
            decision = dict(reason=reason, asked=n, evicted=evicted, evictable_before=before)
            radix_walk.report_eviction(self, decision, staged_before, after)
        return evicted

    def _maybe_compact(self) -> None:
        """Drop stale heap entries once they outnumber the tree's pages 4 to 1: amortised
        O(1) per push, and the heap stays bounded by the tree, not by how often it is touched."""
        if len(self._heap) > 64 and len(self._heap) > 4 * (self._total // self.page_size + 1):
            self._compact_heap()

    def _compact_heap(self) -> None:
        self._heap = [e for e in self._heap if self._evictable_leaf(e[2], e[0])]
        heapq.heapify(self._heap)

    # -- diagnostics (radix_walk.py) ----------------------------------------------------------

    def shape(self) -> radix_walk.TreeShape:
        """Walk the whole tree and count what is there; never raises (``problems`` says what
        could not be read)."""
        return radix_walk.tree_shape(self)

    def check(self) -> None:
        """Counters agree with the tree and the edge invariant holds; raises AssertionError."""
        radix_walk.check_tree(self)
