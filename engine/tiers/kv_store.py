"""PageStore: the durable KV store, one file per page under a directory, below the host tier.

What it keeps (``store_files`` says how a file is laid out, ``store_fs`` how it is touched):

* **the ledger in allocated bytes**: ``used`` is the sum of ``max(st_blocks*512, st_size)`` over
  every file the store owns (pages and checkpoint files), measured with ``lstat`` after each
  write, so the ledger and the evictor count the same unit; ``used`` never exceeds the cap;
* **pins** (``store_pins``): a checkpoint pins the pages it references; a key's pin count is the
  number of checkpoints that list it, whether its page is there or not (a page lost and written
  again is pinned at once). Branches share a prefix; unpinning one holder leaves its sibling's
  pages pinned. A checkpoint with a page missing is listed incomplete (``missing``);
* **eviction**: least recently used first, over unpinned pages only (pinning takes a page out of
  the LRU order; unpinning puts it back as the coldest), so a store whose pages are all pinned
  has nothing to walk and says the space is not there. A file that cannot be deleted is passed
  over (at most ``skip_budget`` in one call), counted in the receipt and marked ``stuck``:
  no longer reclaimable, never walked again. ``reclaimable = used - pinned - stuck``: what
  eviction can actually free (law 1). A full disk (``ENOSPC``) makes room as a full cap does:
  eviction, then the write once more; still full, the write's error says so with the numbers;
* **the index**, rebuilt at boot from the files' headers (``scan``): partial files (``*.tmp``)
  and pages another model wrote are reaped; anything at a name of the store's layout that is
  not what the store writes there (a link, a FIFO, a malformed header or JSON) is set aside into
  ``quarantine/``, never fatal; each move a receipt. A page that fails its checksum when it is
  loaded is set aside the same way.

Every move is a receipt: ``store.write``, ``store.load``, ``store.evict``, ``store.reap``,
``store.quarantine``, ``store.scan``, ``checkpoint.create``, ``checkpoint.delete``,
``checkpoint.delete_failed``, ``checkpoint.refuse``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Iterable
from itertools import takewhile
from pathlib import Path
from typing import NamedTuple

from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.tiers.store_books import Entry
from engine.tiers.store_files import (
    PAGE_EXT,
    ChecksumMismatch,
    PageHeader,
    StoreFileError,
    allocated_bytes,
    checksum,
    encode_page,
    load_json,
    page_readers,
    page_rel,
    read_header,
    read_payload,
)
from engine.tiers.store_fs import TMP, NotAStoreFile, StoreFS, is_store_file
from engine.tiers.store_pins import CheckpointStore, Refused, Undeletable
from engine.tiers.store_scan import Checkpoint, Scanned, scan_store

IDENTITY_FILE = "STORE.json"


class PageIn(NamedTuple):
    """A page to write: its key, its parent's key, its tokens and its KV bytes."""

    key: str
    parent: str | None
    tokens: list[int]
    payload: bytes | memoryview


class PageStore(CheckpointStore):
    def __init__(
        self,
        root: Path,
        cap_bytes: int,
        identity: str,
        receipts: Receipts,
        *,
        pin_budget: int | None = None,
        skip_budget: int = 64,
        orphan_age_s: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root, self.identity = Path(root), identity
        self.fs = StoreFS(self.root)
        self.pin_budget = cap_bytes if pin_budget is None else pin_budget
        self.receipts, self.skip_budget, self.orphan_age_s = receipts, skip_budget, orphan_age_s
        self.clock = clock
        CheckpointStore.__init__(self, cap_bytes)
        self._unit = 4096  # the filesystem's allocation unit, read when the store is scanned
        self.short: str | None = None  # why the last page asked for is not stored (None: it is)

    # -- boot ---------------------------------------------------------------------------------

    def claim(self) -> str | None:
        """Make the directory this model's store (``STORE.json`` names its identity); returns
        why it cannot be: another model's store, a ``STORE.json`` the store did not write, or a
        directory it cannot write."""
        try:
            try:
                held = load_json(self.fs.read(IDENTITY_FILE, 1 << 16), IDENTITY_FILE)
            except FileNotFoundError:
                held = {"identity": self.identity}
            if not isinstance(held, dict) or held.get("identity") != self.identity:
                who = held.get("identity") if isinstance(held, dict) else held
                return f"{self.root} holds another model's store (identity {who})"
            self.fs.write_atomic(IDENTITY_FILE, json.dumps({"identity": self.identity}).encode())
        except (OSError, StoreFileError) as e:
            return f"cannot use {self.root}: {type(e).__name__}: {e}"
        return None

    def scan(self) -> Scanned:
        """Rebuild the index from the files: pages by their headers (partial files and pages
        another model wrote reaped, what the store did not write as it is set aside),
        checkpoints and their pins (orphans older than ``orphan_age_s`` reaped). Writes
        ``store.scan``."""
        self.entries.clear()
        self.lru.clear()
        self.stuck.clear()
        self.checkpoints.clear()
        self.pins.clear()
        self.meta.clear()
        self.used = self.pinned = 0
        self.root.mkdir(parents=True, exist_ok=True)
        self._unit = max(512, os.statvfs(self.root).f_frsize)
        found = scan_store(self.fs, self.identity, self.clock(), self.orphan_age_s)
        for key, header, st in sorted(found.pages, key=lambda p: p[2].st_mtime):  # oldest first
            self._add(
                key, Entry(header.parent, len(header.tokens), allocated_bytes(st), st.st_size)
            )
        for path, size in found.meta.items():
            self._meta(path, size)
        self._count_identity()
        for cp in found.checkpoints:
            self._pin(cp)
            self.receipts.emit(
                schema.CHECKPOINT_FOUND,
                id=cp.id,
                tokens=cp.tokens,
                pages=len(cp.keys),
                missing=self.missing(cp),
                complete=cp.complete,
            )
        for reason, paths in found.reaped.items():
            self._reap(reason, paths)
        for aside in found.aside:
            self._set_aside(*aside)
        self.receipts.emit(
            schema.STORE_SCAN,
            files=found.files,
            pages=len(self.entries),
            checkpoints=len(self.checkpoints),
            allocated=self.used,
            apparent=found.apparent,
            reaped={r: len(p) for r, p in found.reaped.items()},
            set_aside=len(found.aside),
            seconds=round(found.seconds, 6),
            **self.capacity(),
        )
        return found

    def _count_identity(self) -> None:
        try:
            st = self.fs.lstat(IDENTITY_FILE)
        except OSError:
            return
        if is_store_file(st):
            self._meta(IDENTITY_FILE, allocated_bytes(st))

    def _reap(self, reason: str, paths: list[tuple[str, int, int]]) -> None:
        """Delete files the scan found to be the store's own and of no use; one that will not
        go is said, not fatal."""
        if not paths:
            return
        failed: list[str] = []
        for path, _, _ in paths:
            try:
                self.fs.unlink(path)
            except OSError as e:
                failed.append(f"{path}: {e}")
        self.receipts.emit(
            schema.STORE_REAP,
            reason=reason,
            files=len(paths),
            allocated=sum(a for _, a, _ in paths),
            apparent=sum(s for _, _, s in paths),
            **({"failed": len(failed), "error": failed[0]} if failed else {}),
        )

    def _set_aside(self, path: str, reason: str, detail: str, **fields: object) -> None:
        """Move ``path`` into ``quarantine/`` (a move, never a delete; what cannot be moved is
        left where it is, never read); ``store.quarantine`` either way."""
        try:
            fields["moved_to"] = self.fs.set_aside(path)
        except FileNotFoundError:
            return  # gone meanwhile: nothing to set aside
        except OSError as e:
            fields["error"] = f"{type(e).__name__}: {e.strerror or e}"
        self.receipts.emit(
            schema.STORE_QUARANTINE, path=path, reason=reason, detail=detail, **fields
        )

    # -- pages --------------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        return key in self.entries

    def write(self, pages: Iterable[PageIn], reason: str, rid: str | None = None) -> int:
        """Write the pages not already stored, making room first; a page that finds no room or
        cannot be written is an outcome in the receipt. Returns the pages written."""
        t0 = time.perf_counter()
        pages = list(pages)
        todo = [p for p in pages if p.key not in self.entries]
        # a page is read only below its whole chain: the room for it never comes from that chain
        keep = {p.key for p in pages} | self.stored_above(pages[0].parent if pages else None)
        written = tokens = allocated = apparent = no_room = 0
        error = None
        for page in todo:
            size = _file_size(page)
            beyond = self.reclaimable < size - (self.cap - self.used)
            if beyond or not self._room(size, rid, keep):
                no_room += 1
                self.short = f"no room under its cap ({self.used} of {self.cap} bytes used, {self.pinned} pinned)"
                continue
            try:
                entry = self._write_one(page, keep, rid)
            except OSError as e:
                error = self.short = f"{type(e).__name__}: {e}"
                continue
            self.short = None
            written += 1
            tokens += entry.tokens
            allocated += entry.allocated
            apparent += entry.apparent
        if todo:
            self.receipts.emit(
                schema.STORE_WRITE,
                reason=reason,
                pages=written,
                tokens=tokens,
                allocated=allocated,
                apparent=apparent,
                no_room=no_room,
                rid=rid,
                seconds=round(time.perf_counter() - t0, 6),
                **self.capacity(),
                **({"error": error} if error else {}),
            )
        return written

    def _room(self, size: int, rid: str | None, keep: Collection[str] = ()) -> bool:
        """Evict until ``size`` more allocated bytes fit under the cap (by the allocation unit of
        the filesystem, a guess the write corrects); the pages ``keep`` names are passed over."""
        short = self.used + size - self.cap
        if short > 0:
            self.evict(short, reason="write", rid=rid, keep=keep)
        return self.used + size <= self.cap

    def _write_one(self, page: PageIn, keep: Collection[str], rid: str | None) -> Entry:
        header = PageHeader(
            page.key,
            page.parent,
            list(page.tokens),
            self.identity,
            len(page.payload),
            checksum(page.payload),
        )
        data, rel = encode_page(header, page.payload), page_rel(page.key)
        st = self.write_room(rel, data, self._charged(_file_size(page)), keep, rid)
        entry = Entry(page.parent, len(page.tokens), allocated_bytes(st), st.st_size)
        self._add(page.key, entry)
        if self.used > self.cap:  # the filesystem charged more than the guess: pay it back
            self.evict(self.used - self.cap, reason="write", keep=keep)
            if self.used > self.cap:
                self._delete(page.key)
                raise OSError(f"no room for {entry.allocated} allocated bytes under the cap")
        return entry

    def read(self, keys: list[str], rid: str | None = None, size: int | None = None) -> list[bytes]:
        """The payloads of ``keys``, in order, up to the first that is missing, corrupt or not
        ``size`` bytes (such a file is set aside, ``store.quarantine``). The files are read and
        checked by a few threads at once (a cold read waits on the disk per file). Writes
        ``store.load``."""
        t0 = time.perf_counter()
        present = list(takewhile(self.entries.__contains__, keys))
        out: list[bytes] = []
        error = None
        fetch = lambda key: self._fetch(key, size)  # noqa: E731
        for key, (payload, bad) in zip(present, page_readers().map(fetch, present)):
            if bad is not None:
                error = f"{bad[1]}"
                self._lose(key, *bad)
                break
            out.append(payload)
            if key in self.lru:
                self.lru.move_to_end(key)
        n = len(out)
        self.receipts.emit(
            schema.STORE_LOAD,
            pages=n,
            asked=len(keys),
            tokens=sum(self.entries[k].tokens for k in keys[:n]),
            bytes=sum(map(len, out)),
            seconds=round(time.perf_counter() - t0, 6),
            rid=rid,
            **({"error": error} if error else {}),
        )
        return out

    def _fetch(self, key: str, size: int | None) -> tuple[bytes, tuple[str, str] | None]:
        """One page's payload, checked; or (reason, why) not (a reader thread's work: no books
        touched)."""
        rel = page_rel(key)
        try:
            with self.fs.open(rel) as (fh, st):
                header = read_header(fh, st.st_size, rel)
                if header.key != key or header.identity != self.identity:
                    raise StoreFileError(f"{rel}: names another page or model")
                payload = read_payload(fh, header, rel)
            if size is not None and len(payload) != size:
                raise StoreFileError(f"{rel}: a payload of {len(payload)} bytes, a page is {size}")
        except ChecksumMismatch as e:
            return b"", ("checksum", f"ChecksumMismatch: {e}")
        except StoreFileError as e:
            return b"", ("malformed", f"StoreFileError: {e}")
        except NotAStoreFile as e:
            return b"", ("wrong_type", f"NotAStoreFile: {e}")
        except FileNotFoundError as e:
            return b"", ("gone", f"FileNotFoundError: {e}")
        except OSError as e:
            return b"", ("unreadable", f"{type(e).__name__}: {e}")
        return payload, None

    def _lose(self, key: str, reason: str, why: str) -> None:
        """A page that could not be loaded leaves the index; its file is set aside (gone: there
        is none). The checkpoints that pin it keep their pins (it is pinned again once written
        again) and are listed incomplete meanwhile."""
        self._forget(key)
        if reason != "gone":
            held = sorted(cp.id for cp in self.checkpoints.values() if key in cp.keys)
            self._set_aside(page_rel(key), reason, why, checkpoints=held)

    def _delete(self, key: str) -> bool:
        try:
            self.fs.unlink(page_rel(key))
        except OSError:
            return False
        self._forget(key)
        return True

    def evict(
        self, need: int, reason: str, rid: str | None = None, keep: Collection[str] = ()
    ) -> int:
        """Delete least recently used unpinned pages but those ``keep`` names until ``need``
        allocated bytes are freed; a file that will not go is passed over (at most
        ``skip_budget`` a call) and marked stuck. Returns the bytes freed; ``store.evict``."""
        freed = pages = skipped = 0
        error = None
        for key in list(self.lru):
            if freed >= need or skipped > self.skip_budget:
                break
            if key in keep:
                continue
            size = self.entries[key].allocated
            if self._delete(key):
                freed += size
                pages += 1
                continue
            skipped += 1
            error = f"{page_rel(key)} could not be deleted"
            self.lru.pop(key)
            self.stuck.add(key)
        self.receipts.emit(
            schema.STORE_EVICT,
            reason=reason,
            asked=need,
            freed=freed,
            pages=pages,
            skipped=skipped,
            pinned_pages=sum(1 for e in self.entries.values() if e.pins),
            rid=rid,
            **self.capacity(),
            **({"error": error} if error else {}),
        )
        return freed


def _file_size(page: PageIn) -> int:
    """A page file's size before it is written (the header's length estimated generously)."""
    return len(page.payload) + 200 + 24 * len(page.tokens) + len(PAGE_EXT) + len(TMP)


__all__ = ["Checkpoint", "Entry", "PageIn", "PageStore", "Refused", "Undeletable"]
