"""RadixCache: a prefix tree of token ids whose nodes own the KV slots of those tokens.

* Keys are page-aligned: a node's key length is a multiple of ``page_size``, so a cached
  prefix is always whole pages and can be shared without copying.
* Lock refs: a running request locks the node its prefix ends at; ``inc_lock_ref`` and
  ``dec_lock_ref`` walk to the root, and a split copies the lock onto the new upper node, so
  ``lock_ref(parent) >= lock_ref(child)`` holds on every edge. Hence an unlocked node has no
  locked descendant and peeling unlocked leaves reaches every unlocked token.
* Counters: ``evictable_size()`` is the tokens in unlocked nodes, ``protected_size()`` the
  tokens in locked ones. Because of the edge invariant, ``evict(evictable_size())`` frees
  exactly ``evictable_size()`` tokens: the counter never promises what eviction cannot pay.
* Eviction frees LRU unlocked leaves (and parents that become unlocked leaves) through the
  allocator, whose open free group may stage them; the ``eviction`` receipt says how many.

Ownership: ``insert(tokens, slots)`` hands the cache the slots of the page-aligned part of
``tokens``; slots that duplicate tokens already cached (with other slots) are freed by the cache.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from engine.mem.allocator import TokenAllocator
from engine.obs import schema
from engine.obs.receipts import Receipts


class TreeNode:
    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access", "id")

    def __init__(
        self, nid: int, key: list[int], value: torch.Tensor, parent: TreeNode | None
    ) -> None:
        self.id = nid
        self.key = key
        self.value = value  # slots, len(value) == len(key)
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = time.monotonic()

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock={self.lock_ref}, children={len(self.children)})"


class MatchResult(NamedTuple):
    slots: torch.Tensor  # slots of the matched prefix, page-aligned
    node: TreeNode  # the node the match ends at (the root when nothing matched)

    @property
    def length(self) -> int:
        return int(self.slots.numel())


@dataclass(slots=True)
class TreeShape:
    nodes: int = 0  # excluding the root
    tokens: int = 0
    locked_nodes: int = 0
    locked_tokens: int = 0
    leaves: int = 0
    depth: int = 0
    problems: list[str] = field(default_factory=list)  # what the walk could not read


def _common_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RadixCache:
    def __init__(
        self,
        allocator: TokenAllocator,
        *,
        disabled: bool = False,
        receipts: Receipts | None = None,
    ) -> None:
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.disabled = disabled
        self.receipts = receipts or Receipts()
        self._ids = itertools.count()
        self._tick = itertools.count()  # tie-breaker: LRU order among equal timestamps
        self.reset()

    def reset_to_empty(self) -> None:
        """Evict everything (locked nodes stay): for benchmarks that must start cold."""
        self.evict(self.evictable_size(), reason="reset")

    def reset(self) -> None:
        self.root = TreeNode(next(self._ids), [], torch.empty(0, dtype=torch.int64), None)
        self.root.lock_ref = 1  # the root is never evicted
        self._evictable = 0
        self._protected = 0
        self._total = 0
        # lazy LRU heap of (last_access, tick, node); stale entries are skipped on pop
        self._heap: list[tuple[float, int, TreeNode]] = []
        self._last_stamp = -math.inf

    # -- counters -----------------------------------------------------------------------------

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

    def _touch(self, node: TreeNode, now: float) -> None:
        # Stamps are strictly increasing: a heap entry is current only if its stamp is still the
        # node's, so a clock that repeats a reading (a coarse one) must not make an older entry
        # of a re-touched node pass for the newer one and invert the LRU order.
        if now <= self._last_stamp:
            now = math.nextafter(self._last_stamp, math.inf)
        self._last_stamp = now
        node.last_access = now
        if not node.children and node.lock_ref == 0:
            heapq.heappush(self._heap, (now, next(self._tick), node))
            self._maybe_compact()  # stale entries pile up while nothing evicts

    def match_prefix(self, tokens: list[int]) -> MatchResult:
        """The longest cached page-aligned prefix of ``tokens``. A match ending inside a node
        splits it there, so the returned node covers exactly the matched prefix."""
        empty = torch.empty(0, dtype=torch.int64)
        if self.disabled:
            return MatchResult(empty, self.root)
        key = list(tokens[: self._aligned(len(tokens))])
        node, values, now = self.root, [], time.monotonic()
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            n = self._aligned(_common_len(child.key, key))
            if n == 0:
                break
            if n < len(child.key):
                child = self._split(child, n)
            values.append(child.value)
            node = child
            self._touch(node, now)
            key = key[n:]
        slots = torch.cat(values) if values else empty
        return MatchResult(slots, node)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child`` after ``n`` tokens; the new upper node takes the first ``n``."""
        upper = TreeNode(next(self._ids), child.key[:n], child.value[:n], child.parent)
        upper.lock_ref = child.lock_ref  # both halves are held by whoever held the whole
        upper.last_access = child.last_access
        upper.children = {self._child_key(child.key[n:]): child}
        assert child.parent is not None
        child.parent.children[self._child_key(child.key)] = upper
        child.parent = upper
        child.key = child.key[n:]
        child.value = child.value[n:]
        return upper

    # -- insertion ----------------------------------------------------------------------------

    def insert(self, tokens: list[int], slots: torch.Tensor) -> int:
        """Cache ``tokens`` (page-aligned part) with their ``slots``; returns the tokens newly
        added. The cache owns those slots afterwards: the ones that duplicate an already cached
        prefix with different slots are freed here."""
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

    # -- locks --------------------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
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
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                if not node.children:
                    self._touch(node, now)
            node = node.parent

    # -- eviction -----------------------------------------------------------------------------

    def _evictable_leaf(self, node: TreeNode, stamp: float) -> bool:
        return (
            node.parent is not None
            and node.lock_ref == 0
            and not node.children
            and node.last_access == stamp
            and node.parent.children.get(self._child_key(node.key)) is node
        )

    def evict(self, n: int, reason: str = "requested") -> int:
        """Free at least ``n`` tokens of LRU unlocked leaves if that many are evictable;
        returns the tokens actually freed (whole nodes, so possibly more than ``n``)."""
        before = self._evictable
        staged_before = self.allocator.staged_size()
        evicted = 0
        while evicted < n and self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            if not self._evictable_leaf(node, stamp):
                continue  # stale: touched again, locked, grown children or already gone
            self.allocator.free(node.value)
            size = len(node.key)
            evicted += size
            self._evictable -= size
            self._total -= size
            parent = node.parent
            del parent.children[self._child_key(node.key)]
            node.parent = None
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(self._heap, (parent.last_access, next(self._tick), parent))
        self._maybe_compact()
        if n > 0:
            self._report(reason, n, evicted, before, staged_before)
        return evicted

    def _report(
        self, reason: str, asked: int, evicted: int, before: int, staged_before: int
    ) -> None:
        decision = dict(reason=reason, asked=asked, evicted=evicted, evictable_before=before)
        self.receipts.emit(
            schema.EVICTION,
            **decision,
            staged=self.allocator.staged_size() - staged_before,
            evictable_after=self._evictable,
            available_after=self.allocator.available_size(),
        )
        if evicted < min(asked, before):
            self.receipts.emit(
                schema.EVICTION_UNDER_DELIVERED,
                **decision,
                note="the evictable counter promised tokens that eviction could not free",
            )

    def _maybe_compact(self) -> None:
        """Drop stale heap entries once they outnumber the tree's pages 4 to 1: amortised
        O(1) per push, and the heap stays bounded by the tree, not by how often it is touched."""
        if len(self._heap) > 64 and len(self._heap) > 4 * (self._total // self.page_size + 1):
            self._compact_heap()

    def _compact_heap(self) -> None:
        self._heap = [e for e in self._heap if self._evictable_leaf(e[2], e[0])]
        heapq.heapify(self._heap)

    # -- diagnostics --------------------------------------------------------------------------

    def shape(self) -> TreeShape:
        """Walk the whole tree (iteratively: depth is unbounded) and count what is there.
        Never raises: a node that cannot be read is reported in ``problems`` and skipped."""
        out = TreeShape()
        try:
            stack: list[tuple[TreeNode, int]] = [(self.root, 0)]
        except Exception as e:  # pragma: no cover - the root itself unreadable
            out.problems.append(f"root: {type(e).__name__}: {e}")
            return out
        seen: set[int] = set()
        while stack:
            node, depth = stack.pop()
            try:
                if id(node) in seen:
                    out.problems.append(f"node {node.id} reached twice (a cycle)")
                    continue
                seen.add(id(node))
                children = list(node.children.values())
                if node is not self.root:
                    out.nodes += 1
                    out.tokens += len(node.key)
                    if node.lock_ref > 0:
                        out.locked_nodes += 1
                        out.locked_tokens += len(node.key)
                    if not children:
                        out.leaves += 1
                    out.depth = max(out.depth, depth)
                for c in children:
                    if c.parent is not node:
                        out.problems.append(
                            f"node {c.id} does not point back to its parent {node.id}"
                        )
                    stack.append((c, depth + 1))
            except Exception as e:
                out.problems.append(f"node {getattr(node, 'id', '?')}: {type(e).__name__}: {e}")
        return out

    def check(self) -> None:
        """Counters agree with the tree and the edge invariant holds; raises AssertionError."""
        total = evictable = protected = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            for c in node.children.values():
                if c.lock_ref > node.lock_ref and node is not self.root:
                    raise AssertionError(
                        f"lock ref grows from parent {node.id} ({node.lock_ref}) to child {c.id} ({c.lock_ref})"
                    )
                if len(c.key) % self.page_size or len(c.key) != int(c.value.numel()) or not c.key:
                    raise AssertionError(
                        f"node {c.id} has key {len(c.key)} / value {c.value.numel()} tokens"
                    )
                stack.append(c)
            if node is not self.root:
                total += len(node.key)
                if node.lock_ref:
                    protected += len(node.key)
                else:
                    evictable += len(node.key)
        got = (self._total, self._evictable, self._protected)
        if got != (total, evictable, protected):
            raise AssertionError(
                f"radix counters (total, evictable, protected) = {got}, tree has {(total, evictable, protected)}"
            )
