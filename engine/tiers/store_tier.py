"""StoreTier: the durable KV store (``kv_store.PageStore``) joined to the memory above it.

Write-back: KV that leaves memory for good (a device-only leaf the radix cache evicts without a
host tier, a host-only leaf the host tier drops) is written to the store first, a page per file,
keyed by its whole prefix (``store_files.page_key``); at a clean stop every cached prefix is
written too (``flush``). Load: a prefix hit that the device and host tiers end short of goes on
in the store, page by page while the pages are there, into fresh device pages (as much as the
round's budget funds), which join the radix cache as if computed. A page is the pool's page
(``--page-size``): every layer's K and V for its slots, in the pool's dtype.

``open_store`` opens the store at boot (``store.sized`` says whether and why not): one rank, a
prefix cache, a directory it can write that no other model's store holds. A directory given that
the store cannot use (or will not: more than one rank, no prefix cache) is ``unusable`` (or
``off``) with the reason, which the engine keeps (``Opened.off``): ``/health`` says it
(``store_off``) and ``/v1/checkpoints`` answers 503 with it.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import torch

from engine.config.store import StoreSection
from engine.memory.kv_pool import KVPool
from engine.memory.pages import whole_pages
from engine.memory.radix import MatchResult, RadixCache, TreeNode
from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.tiers.kv_store import PageIn, PageStore
from engine.tiers.store_files import page_key

MIN_BLOCK = 16  # tokens a store page holds at least
DEFAULT_CAP = 16 << 30  # at most, by default; a quarter of the filesystem's free space at least


def model_identity(path: str, described: dict[str, Any]) -> str:
    """Who wrote a page: the weights (their path, sizes and modification times) and everything
    that changes the KV they compute (``described``: config, dtypes, quantisation, page size)."""
    files = []
    p = Path(path)
    for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
        if f.is_file():
            st = f.stat()
            files.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    blob = json.dumps({"files": files, **described}, sort_keys=True, default=str)
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


class Opened(NamedTuple):
    """The store at boot: ``store`` (None: off) and, where a directory was given all the same,
    why it is off (``off``)."""

    store: PageStore | None
    off: str | None


def open_store(
    asked: StoreSection, prefix_cache: bool, tp: int, identity: str, receipts: Receipts
) -> Opened:
    """The store ``asked`` (the config's store section) asks for, scanned; ``store.sized``
    says whether, and why not: ``off`` (none asked, or more than one rank, or no prefix
    cache), ``unusable`` (a directory given that it cannot make, write or claim)."""
    d = asked.kv_store_dir
    why = None
    if tp > 1:
        why = "more than one rank (the store holds one rank's pages)"
    elif not prefix_cache:
        why = "no prefix cache"
    if d is None or why is not None:
        receipts.emit(schema.STORE_SIZED, path="off", reason=why or "no kv_store_dir", dir=d)
        return Opened(None, why)
    root = Path(d)
    try:
        root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(root).free
    except OSError as e:
        free, why = 0, f"cannot use {root}: {type(e).__name__}: {e}"
    cap = asked.kv_store_bytes or min(DEFAULT_CAP, free // 4)
    pins = cap // 2 if asked.kv_store_pin_bytes is None else asked.kv_store_pin_bytes
    store = PageStore(root, cap, identity, receipts, pin_budget=pins)
    why = why or store.claim()
    if why is not None:
        receipts.emit(schema.STORE_SIZED, path="unusable", reason=why, dir=d)
        return Opened(None, why)
    receipts.emit(
        schema.STORE_SIZED,
        path="configured",
        dir=d,
        cap=store.cap,
        pin_budget=store.pin_budget,
        identity=identity,
    )
    store.scan()
    return Opened(store, None)


class StoreTier:
    """``kv``: the device pool loads go into. A store page is ``block`` tokens: the smallest
    whole number of the pool's pages that holds at least ``MIN_BLOCK`` tokens (with the default
    page of one token, a file per token would be thousands of files for one conversation)."""

    def __init__(
        self, store: PageStore, kv: KVPool, page_size: int, write: str = "second_hit"
    ) -> None:
        self.store, self.kv, self.page_size, self.write = store, kv, page_size, write
        self.retired: str | None = None  # why the store is off since boot (None: it is on)
        self.block = whole_pages(MIN_BLOCK, page_size)
        layer = kv.layers[0].k
        self.page_shape = (len(kv.layers), 2, self.block, *layer.shape[1:])
        self.dtype = kv.dtype
        self.page_bytes = math.prod(self.page_shape) * layer.element_size()  # a page's payload

    def retire(self, reason: str) -> None:
        """Off from now on (another model's KV would be computed): nothing read or written;
        ``store.sized`` says why. What it holds stays on disk for the model that wrote it."""
        if self.retired is None:
            self.retired = reason
            self.store.receipts.emit(
                schema.STORE_SIZED, path="off", reason=reason, dir=str(self.store.root)
            )

    def page_keys(self, tokens: list[int]) -> list[str]:
        """The keys of ``tokens``' whole store pages, each naming the prefix up to its end."""
        keys, parent, b = [], None, self.block
        for at in range(0, len(tokens) - len(tokens) % b, b):
            parent = page_key(parent, tokens[at : at + b], self.store.identity)
            keys.append(parent)
        return keys

    # -- memory -> store ----------------------------------------------------------------------

    def keep(
        self, cache: RadixCache, node: TreeNode, pool: KVPool, slots: torch.Tensor, reason: str
    ) -> int:
        """Write the store pages that end inside ``node`` (its KV at ``slots`` of ``pool``; a page
        that begins above it reads the rest from its ancestors, on the device or the host) and
        that the store lacks, before that KV is dropped. The tokens past a leaf's last whole
        page are not written. Never raises: a failure is the write receipt's outcome."""
        if self.retired is not None:
            return 0
        tokens = prefix_tokens(node)
        start = len(tokens) - len(node.key)
        return self._keep(cache, (node, pool, slots), reason, tokens, self.page_keys(tokens), start)

    def _keep(
        self,
        cache: RadixCache,
        at: tuple[TreeNode, KVPool, torch.Tensor],
        reason: str,
        tokens: list[int],
        keys: list[str],
        start: int,
    ) -> int:
        """``keep`` of ``at`` (a node, the pool its KV is in, its slots there) that begins at
        token ``start``, with ``tokens`` (the prefix to its end, or longer) and their page
        ``keys`` known."""
        node, pool, slots = at
        try:
            b = self.block
            end = start + len(node.key)
            todo = [i for i in range(start // b, end // b) if not self.store.has(keys[i])]
            if not todo:
                return 0
            lo = todo[0] * b
            segs = self._segments(cache, node, pool, slots, start, lo)
            kv = torch.cat([self._gather(p, s) for p, s in segs], 2)
            pages = [
                PageIn(
                    keys[i],
                    keys[i - 1] if i else None,
                    tokens[i * b : (i + 1) * b],
                    _bytes(kv[:, :, i * b - lo : (i + 1) * b - lo]),
                )
                for i in todo
            ]
            return self.store.write(pages, reason=reason)
        except Exception as e:  # an error path must not raise into eviction
            self.store.receipts.emit(
                schema.STORE_WRITE,
                reason=reason,
                pages=0,
                tokens=0,
                allocated=0,
                apparent=0,
                error=f"{type(e).__name__}: {e}",
            )
            return 0

    def _segments(
        self,
        cache: RadixCache,
        node: TreeNode,
        pool: KVPool,
        slots: torch.Tensor,
        at: int,
        lo: int,
    ) -> list[tuple[KVPool, torch.Tensor]]:
        """Where the KV of the prefix's tokens from ``lo`` to ``node``'s end is (``node`` begins
        at token ``at``): (pool, slots) runs, top down; ``node``'s own given, its ancestors'
        read from them."""
        segs = [(pool, slots)]
        n = node.parent
        while at > lo:
            if n is None or n.parent is None:
                raise RuntimeError("a page's tokens reach above the tree")
            if n.value is not None:
                segs.append((self.kv, n.value))
            elif n.host is not None and cache.tier is not None:
                segs.append((cache.tier.kv, n.host))
            else:
                raise RuntimeError(f"node {n.id}'s KV is nowhere")
            at -= len(n.key)
            n = n.parent
        segs.reverse()
        first_pool, first = segs[0]
        segs[0] = (first_pool, first[lo - at :])
        return segs

    def _gather(self, pool: KVPool, slots: torch.Tensor) -> torch.Tensor:
        """[layers, 2, tokens, heads, dim] of ``slots`` in ``pool``, on the CPU."""
        s = slots.to(pool.layers[0].k.device)
        k = torch.stack([layer.k.index_select(0, s) for layer in pool.layers])
        v = torch.stack([layer.v.index_select(0, s) for layer in pool.layers])
        return torch.stack([k, v], 1).cpu()

    def keep_path(self, cache: RadixCache, node: TreeNode, reason: str = "checkpoint") -> int:
        """Write the pages of ``node`` and every node above it that the store lacks, from the
        device or the host tier, wherever each one's KV is."""
        if self.retired is not None:
            return 0
        tokens = prefix_tokens(node)
        keys = self.page_keys(tokens)
        if all(self.store.has(k) for k in keys):
            return 0  # every whole page is stored already (the common second hit and on)
        written, path = 0, []
        while node is not None and node.parent is not None:
            path.append(node)
            node = node.parent
        start = 0
        for n in reversed(path):
            if n.value is not None:
                at = (n, self.kv, n.value)
            elif n.host is not None and cache.tier is not None:
                at = (n, cache.tier.kv, n.host)
            else:
                at = None
            if at is not None:
                written += self._keep(cache, at, reason, tokens, keys, start)
            start += len(n.key)
        return written

    def hit(self, cache: RadixCache, node: TreeNode) -> int:
        """A cached prefix reused (its second use): with ``write`` second_hit its pages are
        written now, so a crash does not lose what is shared; with back, nothing."""
        return self.keep_path(cache, node, "hit") if self.write == "second_hit" else 0

    def flush(self, cache: RadixCache, reason: str = "stop") -> int:
        """Write every cached prefix's pages (at a clean stop, so the next boot finds them)."""
        written, stack = 0, list(cache.root.children.values())
        while stack:
            node = stack.pop()
            if node.value is not None:
                written += self.keep(cache, node, self.kv, node.value, reason)
            stack.extend(node.children.values())
        return written

    # -- store -> device ----------------------------------------------------------------------

    def load(
        self, cache: RadixCache, tokens: list[int], match: MatchResult, limit: int, rid: str | None
    ) -> MatchResult:
        """Go on from ``match`` (a hit of ``tokens`` with nothing left on the host) with the
        store's pages, at most ``limit`` new tokens, into fresh device pages that join the
        cache. The first page may begin inside the match: only its tail is copied. The caller
        holds a lock on ``match.node`` and holds one on the returned match's node instead."""
        if match.host_len:
            raise ValueError("a store load below a host part not loaded (load the host's first)")
        if self.retired is not None:
            return match
        b, keys = self.block, self.page_keys(tokens)
        start = match.length // b
        skip = match.length - start * b
        n = 0
        while start + n < len(keys) and self.store.has(keys[start + n]):
            n += 1
        n = min(n, (max(0, limit) + skip) // b)
        if n <= 0:
            return match
        short = n * b - skip - cache.allocator.available_size()
        if short > 0:
            cache.evict(short, reason="load", rid=rid)
        n = min(n, (cache.allocator.available_size() + skip) // b)
        got = keys[start : start + n]
        payloads = self.store.read(got, rid=rid, size=self.page_bytes) if n > 0 else []
        new = len(payloads) * b - skip
        slots = cache.allocator.alloc(new) if new > 0 else None
        if slots is None:
            return match
        self._scatter(payloads, skip, slots)
        end = match.length + new
        cache.insert(tokens[:end], torch.cat([match.slots, slots]))
        loaded = cache.match_prefix(tokens[:end])
        cache.inc_lock_ref(loaded.node)
        cache.dec_lock_ref(match.node)
        return loaded

    def _scatter(self, payloads: list[bytes], skip: int, slots: torch.Tensor) -> None:
        pages = [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in payloads]
        kv = torch.cat([p.view(self.dtype).reshape(self.page_shape) for p in pages], dim=2)
        kv = kv[:, :, skip:].to(self.kv.layers[0].k.device)
        d = slots.to(self.kv.layers[0].k.device)
        for i, layer in enumerate(self.kv.layers):
            layer.k.index_copy_(0, d, kv[i, 0])
            layer.v.index_copy_(0, d, kv[i, 1])


def prefix_tokens(node: TreeNode) -> list[int]:
    """The tokens from the root to the end of ``node``."""
    parts, n = [], node
    while n is not None and n.key:
        parts.append(n.key)
        n = n.parent
    return [t for part in reversed(parts) for t in part]


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()
