"""Whole-tree walks of the radix cache: ``shape`` (what is there, for diagnostics; never raises)
and ``check`` (counters agree with the tree; raises). Both are iterative: depth is unbounded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.observability import schema

# The cache and its nodes are typed loosely here: radix.py imports this module, and an import
# back (even for type checking) would be a circle.
RadixCache = TreeNode = Any


@dataclass(slots=True)
class TreeShape:
    nodes: int = 0  # excluding the root
    tokens: int = 0
    locked_nodes: int = 0
    locked_tokens: int = 0
    leaves: int = 0
    depth: int = 0
    host_tokens: int = 0  # tokens whose KV has a copy in the host tier
    problems: list[str] = field(default_factory=list)  # what the walk could not read


def tree_shape(cache: RadixCache) -> TreeShape:
    """Walk the whole tree and count what is there. Never raises: a node that cannot be read
    is reported in ``problems`` and skipped."""
    out = TreeShape()
    try:
        stack: list[tuple[TreeNode, int]] = [(cache.root, 0)]
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
            if node is not cache.root:
                out.nodes += 1
                out.tokens += len(node.key)
                out.host_tokens += len(node.key) if node.host is not None else 0
                if node.lock_ref > 0:
                    out.locked_nodes += 1
                    out.locked_tokens += len(node.key)
                if not children:
                    out.leaves += 1
                out.depth = max(out.depth, depth)
            for c in children:
                if c.parent is not node:
                    out.problems.append(f"node {c.id} does not point back to its parent {node.id}")
                stack.append((c, depth + 1))
        except Exception as e:
            out.problems.append(f"node {getattr(node, 'id', '?')}: {type(e).__name__}: {e}")
    return out


def _check_node(cache: RadixCache, node: TreeNode, c: TreeNode) -> None:
    if c.lock_ref > node.lock_ref and node is not cache.root:
        raise AssertionError(
            f"lock ref grows from parent {node.id} ({node.lock_ref}) to child {c.id} ({c.lock_ref})"
        )
    sizes = [int(t.numel()) for t in (c.value, c.host) if t is not None]
    if len(c.key) % cache.page_size or not c.key or not sizes or set(sizes) != {len(c.key)}:
        raise AssertionError(f"node {c.id} has key {len(c.key)} / KV {sizes} tokens")
    if c.value is not None and node is not cache.root and node.value is None:
        raise AssertionError(f"node {c.id} is on the device below {node.id}, which is not")


def check_tree(cache: RadixCache) -> None:
    """Counters agree with the tree, the lock edge invariant holds, every node's KV lives
    somewhere (device, host or both) and device nodes hang below device nodes; raises
    AssertionError."""
    total = evictable = protected = 0
    stack = [cache.root]
    while stack:
        node = stack.pop()
        for c in node.children.values():
            _check_node(cache, node, c)
            stack.append(c)
        if node is not cache.root and node.value is not None:
            total += len(node.key)
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
    got = (cache.total_size(), cache.evictable_size(), cache.protected_size())
    if got != (total, evictable, protected):
        raise AssertionError(
            f"radix counters (total, evictable, protected) = {got}, tree has {(total, evictable, protected)}"
        )


def host_backed_reach(cache: RadixCache) -> int:
    """Device tokens that eviction limited to nodes with a host copy could free now: a dry run
    of ``evict(..., host_backed_only=True)`` from the current LRU leaves up (the promise such a
    pass is held to in its receipt)."""
    seen: set[int] = set()
    stack = [
        n for stamp, _, n in cache._heap if cache._evictable_leaf(n, stamp) and n.host is not None
    ]
    tokens = 0
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        tokens += len(node.key)
        p = node.parent
        if (
            p is not None
            and p is not cache.root
            and p.lock_ref == 0
            and p.value is not None
            and p.host is not None
            and all(c.value is None or id(c) in seen for c in p.children.values())
        ):
            stack.append(p)
    return tokens


def report_eviction(
    cache: RadixCache, decision: dict, staged_before: int, after: dict[str, object]
) -> None:
    """An eviction's receipt, and ``eviction.under_delivered`` when it freed less than the
    counter promised."""
    staged = cache.allocator.staged_size() - staged_before
    available = cache.allocator.available_size()
    cache.receipts.emit(
        schema.EVICTION, **decision, staged=staged, **after, available_after=available
    )
    if decision["evicted"] < min(decision["asked"], decision["evictable_before"]):
        cache.receipts.emit(
            schema.EVICTION_UNDER_DELIVERED,
            **decision,
            note="the evictable counter promised tokens that eviction could not free",
        )
