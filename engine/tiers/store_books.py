"""The durable KV store's books: its index of page files and the ledger in allocated bytes.

``used`` is every file the store owns (pages and checkpoint files); ``pinned`` the pages some
checkpoint pins and the checkpoint files themselves (never reclaimable); ``stuck`` the pages
eviction could not delete. ``reclaimable = used - pinned - stuck``: what eviction can actually
free (law 1). Unpinned pages that are not stuck sit in ``lru``, least recently used first: the
only pages eviction walks. A key's pin count is the number of checkpoints listing it, kept
whether its page is stored or not: a pinned page lost (set aside when it failed its checksum)
and written again is pinned again at once, never evictable meanwhile.
``kv_store.PageStore`` keeps these books as it moves files.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from engine.tiers.store_scan import Checkpoint


@dataclass(slots=True)
class Entry:
    """One page file in the index."""

    parent: str | None
    tokens: int
    allocated: int
    apparent: int
    pins: int = 0


class StoreBooks:
    def __init__(self, cap_bytes: int) -> None:
        self.cap = cap_bytes
        self.entries: dict[str, Entry] = {}
        self.lru: OrderedDict[str, None] = OrderedDict()  # unpinned, not stuck; oldest first
        self.stuck: set[str] = set()  # page files eviction could not delete
        self.checkpoints: dict[str, Checkpoint] = {}
        self.pins: dict[str, int] = {}  # key -> checkpoints listing it (its page stored or not)
        self.meta: dict[str, int] = {}  # checkpoint files (relative paths): allocated bytes
        self.used = self.pinned = 0

    # -- the ledger ---------------------------------------------------------------------------

    @property
    def stuck_bytes(self) -> int:
        return sum(self.entries[k].allocated for k in self.stuck if self.entries[k].pins == 0)

    @property
    def reclaimable(self) -> int:
        return self.used - self.pinned - self.stuck_bytes

    def capacity(self) -> dict[str, int]:
        """The store's numbers in allocated bytes: ``reclaimable`` is what eviction can free."""
        return {
            "cap": self.cap,
            "used": self.used,
            "pinned": self.pinned,
            "reclaimable": self.reclaimable,
        }

    def stored_above(self, key: str | None) -> set[str]:
        """``key`` and the stored pages above it, up to its chain's head or its first missing
        page (a page is read only below its whole chain)."""
        chain: set[str] = set()
        while key is not None and key in self.entries and key not in chain:
            chain.add(key)
            key = self.entries[key].parent
        return chain

    def missing(self, cp: Checkpoint) -> int:
        """The pages ``cp`` pins that are not in the store."""
        return sum(1 for k in set(cp.keys) if k not in self.entries)

    def _add(self, key: str, entry: Entry) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.used -= old.allocated
            if old.pins:
                self.pinned -= old.allocated
        entry.pins = self.pins.get(key, 0)
        self.entries[key] = entry
        self.used += entry.allocated
        if entry.pins:
            self.pinned += entry.allocated
        else:
            self.lru[key] = None
            self.lru.move_to_end(key)
        self.stuck.discard(key)

    def _forget(self, key: str) -> None:
        entry = self.entries.pop(key)
        self.used -= entry.allocated
        if entry.pins:
            self.pinned -= entry.allocated
        self.lru.pop(key, None)
        self.stuck.discard(key)

    def _meta(self, path: str, size: int | None) -> None:
        """A checkpoint file now holds ``size`` allocated bytes (None: gone). They are used and
        never reclaimable, so they count as pinned."""
        old = self.meta.pop(path, 0)
        self.used -= old
        self.pinned -= old
        if size is not None:
            self.meta[path] = size
            self.used += size
            self.pinned += size

    def _pin(self, cp: Checkpoint) -> None:
        for key in dict.fromkeys(cp.keys):
            self.pins[key] = self.pins.get(key, 0) + 1
            entry = self.entries.get(key)
            if entry is None:
                continue
            if entry.pins == 0:
                self.pinned += entry.allocated
                self.lru.pop(key, None)
                self.stuck.discard(key)
            entry.pins += 1
        self.checkpoints[cp.id] = cp

    def _unpin(self, cp: Checkpoint) -> None:
        for key in dict.fromkeys(cp.keys):
            if self.pins[key] > 1:
                self.pins[key] -= 1
            else:
                del self.pins[key]
            entry = self.entries.get(key)
            if entry is None:
                continue
            entry.pins -= 1
            if entry.pins == 0:
                self.pinned -= entry.allocated
                self.lru[key] = None
                self.lru.move_to_end(key, last=False)  # the coldest: it was only kept for the pin
        del self.checkpoints[cp.id]

    def pin_numbers(self, keys: Iterable[str]) -> tuple[int, int]:
        """(new, shared): allocated bytes ``keys`` would pin that nothing pins yet, and that
        another checkpoint pins already."""
        new = shared = 0
        for key in dict.fromkeys(keys):
            entry = self.entries[key]
            if entry.pins:
                shared += entry.allocated
            else:
                new += entry.allocated
        return new, shared
