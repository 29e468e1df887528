"""Re-homing live KV into a device pool of another size (a pool cutover).

Every page in use (a resident's private pages, a cached prefix's pages) moves to a page of the
new pool; its K and V are copied there, and every slot table that names it (the residents' rows
of the request table, the radix nodes' device slots) is rewritten through one map, so a resident
keeps decoding where it was. The plan is made and checked, and the new pool allocated, before
anything changes: a resize that cannot be done raises and leaves the old pool serving.
"""

from __future__ import annotations

import torch

from engine.memory.allocator import TokenAllocator
from engine.memory.kv_pool import KVPool
from engine.memory.radix import RadixCache, TreeNode
from engine.memory.req_table import ReqToTokenPool
from engine.tiers.host_tier import copy_kv


def device_nodes(cache: RadixCache) -> list[TreeNode]:
    """The nodes holding device slots (iterative: the tree's depth is unbounded)."""
    out, stack = [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        if node.value is not None and node.value.numel():
            out.append(node)
        stack.extend(node.children.values())
    return out


def rehome_pool(
    allocator: TokenAllocator,
    kv: KVPool,
    req_table: ReqToTokenPool,
    cache: RadixCache,
    rows: list[tuple[int, int]],
    capacity: int,
) -> int:
    """Resize the pool behind ``allocator`` and ``kv`` to ``capacity`` tokens, carrying every
    page in use. ``rows``: (request row, tokens held) of each resident. Returns the tokens
    copied. Raises (nothing changed) when what is in use does not fit."""
    page_map = allocator.page_map(capacity)
    slots = allocator.slot_map(page_map)
    nodes = device_nodes(cache)
    node_slots = [slots[n.value] for n in nodes]
    row_slots = [slots[req_table.table[row, :n]] for row, n in rows]
    if any(bool((s < 0).any()) for s in (*node_slots, *row_slots)):
        raise RuntimeError("a slot table names a slot the allocator does not hold in use")
    kept = int((page_map > 0).sum())
    first = kv.layers[0].k
    _, heads, dim = first.shape
    pool_slots = (capacity // allocator.page_size + 1) * allocator.page_size
    dest = KVPool(len(kv.layers), pool_slots, heads, dim, kv.dtype, device=first.device)
    src = torch.nonzero(slots >= 0).flatten()
    copy_kv(kv, src, dest, slots[src])
    # the commit: nothing below allocates or can fail halfway
    kv.take_over(dest)
    allocator.resize(capacity, kept)
    for node, s in zip(nodes, node_slots):
        node.value = s
    for (row, _), s in zip(rows, row_slots):
        req_table.write(row, 0, s)
    return int(src.numel())
