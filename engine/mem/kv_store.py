"""PageStore: the durable KV store, one file per page under a directory, below the host tier.

What it keeps (``store_files`` says how a file is laid out):

* **the ledger in allocated bytes**: ``used`` is the sum of ``max(st_blocks*512, st_size)`` over
  every file the store owns (pages and checkpoint files), measured with ``os.stat`` after each
  write, so the ledger and the evictor count the same unit; ``used`` never exceeds the cap;
* **pins**: a checkpoint pins the pages it references; a page's pin count is the number of
  checkpoints that list it, so branches share a prefix and unpinning one holder leaves its
  sibling's pages pinned. Pins are durable: a checkpoint is a pins file (written first, listing its
  pages) and a manifest (written last); the next boot counts pins from the files. A pins file
  without a manifest is a checkpoint being written, or an **orphan** (its writer died): it is
  reaped once older than ``orphan_age_s``. A checkpoint whose new pinned bytes would cross the pin
  budget is refused with four numbers (want, held, budget, overshoot) and changes nothing;
* **eviction**: least recently used first, over unpinned pages only (pinning takes a page out of
  the LRU order; unpinning puts it back as the coldest), so a store whose pages are all pinned
  has nothing to walk and says the space is not there. A file that cannot be deleted is passed
  over (at most ``skip_budget`` in one call), counted in the receipt and set aside as ``stuck``:
  no longer reclaimable, never walked again. ``reclaimable = used - pinned - stuck``: what
  eviction can actually free (law 1);
* **the index**, rebuilt at boot from the files' headers (``scan``): partial files (``*.tmp``)
  and corrupt ones are reaped, each move a receipt.

Every move is a receipt: ``store.write``, ``store.load``, ``store.evict``, ``store.reap``,
``store.scan``, ``checkpoint.create``, ``checkpoint.delete``, ``checkpoint.refuse``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Iterable
from itertools import takewhile
from pathlib import Path
from typing import NamedTuple

from engine.mem.store_books import Entry, StoreBooks
from engine.mem.store_files import (
    PAGE_EXT,
    TMP,
    PageHeader,
    StoreFileError,
    allocated_bytes,
    checksum,
    encode_page,
    page_path,
    page_readers,
    read_header,
    read_page,
    write_atomic,
)
from engine.mem.store_scan import Checkpoint, Scanned, scan_store
from engine.obs import schema
from engine.obs.receipts import Receipts

IDENTITY_FILE = "STORE.json"


class PageIn(NamedTuple):
    """A page to write: its key, its parent's key, its tokens and its KV bytes."""

    key: str
    parent: str | None
    tokens: list[int]
    payload: bytes | memoryview


class Refused(NamedTuple):
    """A checkpoint the pin budget cannot hold: the four numbers, in allocated bytes."""

    want: int
    held: int
    budget: int
    overshoot: int


class PageStore(StoreBooks):
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
        self.pin_budget = cap_bytes if pin_budget is None else pin_budget
        self.receipts, self.skip_budget, self.orphan_age_s = receipts, skip_budget, orphan_age_s
        self.clock = clock
        StoreBooks.__init__(self, cap_bytes)
        self._unit = 4096  # the filesystem's allocation unit, read when the store is scanned

    # -- boot ---------------------------------------------------------------------------------

    def claim(self) -> str | None:
        """Make the directory this model's store (``STORE.json`` names its identity); returns
        why it cannot be: another model's store, or a directory it cannot write."""
        path = self.root / IDENTITY_FILE
        try:
            if path.exists():
                held = json.loads(path.read_bytes()).get("identity")
                if held != self.identity:
                    return f"{self.root} holds another model's store (identity {held})"
            write_atomic(path, json.dumps({"identity": self.identity}).encode())
        except (OSError, ValueError, AttributeError) as e:
            return f"cannot use {self.root}: {type(e).__name__}: {e}"
        return None

    def scan(self) -> Scanned:
        """Rebuild the index from the files: pages by their headers (partial and corrupt files,
        and pages another model wrote, reaped), checkpoints and their pins (orphans older than
        ``orphan_age_s`` reaped). Writes ``store.scan``."""
        self.entries.clear()
        self.lru.clear()
        self.stuck.clear()
        self.checkpoints.clear()
        self.meta.clear()
        self.used = self.pinned = 0
        self.root.mkdir(parents=True, exist_ok=True)
        self._unit = max(512, os.statvfs(self.root).f_frsize)
        found = scan_store(self.root, self.identity, self.clock(), self.orphan_age_s)
        for key, header, st, _ in sorted(found.pages, key=lambda p: p[3]):  # oldest first
            self._add(
                key, Entry(header.parent, len(header.tokens), allocated_bytes(st), st.st_size)
            )
        for path, size in found.meta.items():
            self._meta(path, size)
        ident = self.root / IDENTITY_FILE
        if ident.exists():
            self._meta(ident, allocated_bytes(os.stat(ident)))
        for cp in found.checkpoints:
            self._pin(cp)
            missing = sum(1 for k in set(cp.keys) if k not in self.entries)
            self.receipts.emit(
                schema.CHECKPOINT_FOUND, id=cp.id, tokens=cp.tokens, pages=len(cp.keys),
                missing=missing, complete=cp.complete,
            )  # fmt: skip
        for reason, paths in found.reaped.items():
            self._reap(reason, paths)
        self.receipts.emit(
            schema.STORE_SCAN, files=found.files, pages=len(self.entries),
            checkpoints=len(self.checkpoints), allocated=self.used, apparent=found.apparent,
            reaped={r: len(p) for r, p in found.reaped.items()}, seconds=round(found.seconds, 6),
            **self.capacity(),
        )  # fmt: skip
        return found

    def _reap(self, reason: str, paths: list[tuple[Path, int, int]]) -> None:
        """Delete files the scan found unusable; one that will not go is said, not fatal."""
        if not paths:
            return
        failed: list[str] = []
        for path, _, _ in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                failed.append(f"{path.name}: {e}")
        self.receipts.emit(
            schema.STORE_REAP, reason=reason, files=len(paths),
            allocated=sum(a for _, a, _ in paths), apparent=sum(s for _, _, s in paths),
            **({"failed": len(failed), "error": failed[0]} if failed else {}),
        )  # fmt: skip

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
                continue
            try:
                entry = self._write_one(page, keep)
            except OSError as e:
                error = f"{type(e).__name__}: {e}"
                continue
            written += 1
            tokens += entry.tokens
            allocated += entry.allocated
            apparent += entry.apparent
        if todo:
            self.receipts.emit(
                schema.STORE_WRITE, reason=reason, pages=written, tokens=tokens,
                allocated=allocated, apparent=apparent, no_room=no_room, rid=rid,
                seconds=round(time.perf_counter() - t0, 6), **self.capacity(),
                **({"error": error} if error else {}),
            )  # fmt: skip
        return written

    def _room(self, size: int, rid: str | None, keep: Collection[str] = ()) -> bool:
        """Evict until ``size`` more allocated bytes fit under the cap (by the allocation unit of
        the filesystem, a guess the write corrects); the pages ``keep`` names are passed over."""
        short = self.used + size - self.cap
        if short > 0:
            self.evict(short, reason="write", rid=rid, keep=keep)
        return self.used + size <= self.cap

    def _write_one(self, page: PageIn, keep: Collection[str]) -> Entry:
        path = page_path(self.root, page.key)
        header = PageHeader(
            page.key, page.parent, list(page.tokens), self.identity, len(page.payload),
            checksum(page.payload),
        )  # fmt: skip
        write_atomic(path, encode_page(header, page.payload))
        st = os.stat(path)
        entry = Entry(page.parent, len(page.tokens), allocated_bytes(st), st.st_size)
        self._add(page.key, entry)
        if self.used > self.cap:  # the filesystem charged more than the guess: pay it back
            self.evict(self.used - self.cap, reason="write", keep=keep)
            if self.used > self.cap:
                self._delete(page.key)
                raise OSError(f"no room for {entry.allocated} allocated bytes under the cap")
        return entry

    def read(self, keys: list[str], rid: str | None = None) -> list[bytes]:
        """The payloads of ``keys``, in order, up to the first that is missing or corrupt (a
        corrupt file is reaped). The files are read and checked by a few threads at once (a
        cold read waits on the disk per file). Writes ``store.load``."""
        t0 = time.perf_counter()
        present = list(takewhile(self.entries.__contains__, keys))
        out: list[bytes] = []
        error = None
        for key, (payload, err) in zip(present, page_readers().map(self._fetch, present)):
            if err is not None:
                error = err
                self._reap_one(key, "corrupt")
                break
            out.append(payload)
            if key in self.lru:
                self.lru.move_to_end(key)
        n = len(out)
        self.receipts.emit(
            schema.STORE_LOAD, pages=n, asked=len(keys),
            tokens=sum(self.entries[k].tokens for k in keys[:n]), bytes=sum(map(len, out)),
            seconds=round(time.perf_counter() - t0, 6), rid=rid,
            **({"error": error} if error else {}),
        )  # fmt: skip
        return out

    def _fetch(self, key: str) -> tuple[bytes, str | None]:
        """One page's payload, checked; or why not (a reader thread's work: no books touched)."""
        path = page_path(self.root, key)
        try:
            header, payload = read_page(path)
            if header.key != key or header.identity != self.identity:
                raise StoreFileError(f"{path.name}: names another page or model")
        except (OSError, StoreFileError) as e:
            return b"", f"{type(e).__name__}: {e}"
        return payload, None

    def _reap_one(self, key: str, reason: str) -> None:
        entry = self.entries[key]
        path = page_path(self.root, key)
        self._forget(key)
        self._reap(reason, [(path, entry.allocated, entry.apparent)])

    def _delete(self, key: str) -> bool:
        try:
            page_path(self.root, key).unlink(missing_ok=True)
        except OSError:
            return False
        self._forget(key)
        return True

    def evict(
        self, need: int, reason: str, rid: str | None = None, keep: Collection[str] = ()
    ) -> int:
        """Delete least recently used unpinned pages but those ``keep`` names until ``need``
        allocated bytes are freed; a file that will not go is passed over (at most
        ``skip_budget`` a call) and set aside as stuck. Returns the bytes freed; ``store.evict``."""
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
            error = f"{page_path(self.root, key).name} could not be deleted"
            self.lru.pop(key)
            self.stuck.add(key)
        self.receipts.emit(
            schema.STORE_EVICT, reason=reason, asked=need, freed=freed, pages=pages,
            skipped=skipped, pinned_pages=sum(1 for e in self.entries.values() if e.pins),
            rid=rid, **self.capacity(), **({"error": error} if error else {}),
        )  # fmt: skip
        return freed

    # -- checkpoints --------------------------------------------------------------------------

    def create_checkpoint(self, cid: str, keys: list[str], tokens: int) -> Checkpoint | Refused:
        """Pin ``keys`` (pages in the store) under ``cid``: the pins file first, the manifest
        last. ``want`` counts the pages nothing pins yet and the checkpoint's own two files (as
        the filesystem will charge them). Over the pin budget: refused with the four numbers,
        nothing changed. Raises ValueError for pages not in the store, OSError for files that
        cannot be written or have no room (the checkpoint is then not made)."""
        missing = [k for k in keys if k not in self.entries]
        if missing or cid in self.checkpoints:
            why = f"{len(missing)} pages not in the store" if missing else "the id exists"
            raise ValueError(f"checkpoint {cid}: {why}")
        pages, shared = self.pin_numbers(keys)
        cp = Checkpoint(cid, tuple(keys), tokens, pages, shared, self.clock())
        pins_path, manifest_path = self._paths(cid)
        pins = json.dumps({"id": cid, "keys": keys}).encode()
        manifest = json.dumps(cp._asdict()).encode()
        files = self._charged(len(pins)) + self._charged(len(manifest))
        refused = self._over_budget(cid, tokens, pages + files)
        if refused is not None:
            return refused
        if not self._room(files, None, keep=frozenset(keys)):  # its own pages stay
            raise OSError(f"checkpoint {cid}: no room for its files under the store's cap")
        os.sync()  # its pages reach the disk before anything says they are pinned
        write_atomic(pins_path, pins, sync=True)
        self._meta(pins_path, allocated_bytes(os.stat(pins_path)))
        self._pin(cp)
        try:
            write_atomic(manifest_path, manifest, sync=True)
        except OSError:
            self.delete_checkpoint(cid, say=False)
            raise
        self._meta(manifest_path, allocated_bytes(os.stat(manifest_path)))
        self.receipts.emit(
            schema.CHECKPOINT_CREATE, id=cid, tokens=tokens, pages=len(keys),
            pinned_bytes=pages, shared_bytes=shared, file_bytes=files, **self.capacity(),
        )  # fmt: skip
        return cp

    def _over_budget(self, cid: str, tokens: int, want: int) -> Refused | None:
        overshoot = self.pinned + want - self.pin_budget
        if overshoot <= 0:
            return None
        refused = Refused(want, self.pinned, self.pin_budget, overshoot)
        self.receipts.emit(schema.CHECKPOINT_REFUSE, id=cid, tokens=tokens, **refused._asdict())
        return refused

    def _charged(self, size: int) -> int:
        """What the filesystem under the store will charge for a file of ``size`` bytes: whole
        blocks of its allocation unit, at least one."""
        unit = self._unit
        return max(1, -(-size // unit)) * unit

    def delete_checkpoint(self, cid: str, say: bool = True) -> Checkpoint | None:
        """Remove the manifest first, then the pins: a crash between leaves an orphan, reaped."""
        cp = self.checkpoints.get(cid)
        if cp is None:
            return None
        pins, manifest = self._paths(cid)
        manifest.unlink(missing_ok=True)
        self._meta(manifest, None)
        self._unpin(cp)
        pins.unlink(missing_ok=True)
        self._meta(pins, None)
        if not say:
            return cp
        self.receipts.emit(
            schema.CHECKPOINT_DELETE, id=cid, tokens=cp.tokens, pages=len(cp.keys),
            **self.capacity(),
        )  # fmt: skip
        return cp

    def _paths(self, cid: str) -> tuple[Path, Path]:
        return self.root / "pins" / f"{cid}.json", self.root / "checkpoints" / f"{cid}.json"


def _file_size(page: PageIn) -> int:
    """A page file's size before it is written (the header's length estimated generously)."""
    return len(page.payload) + 200 + 24 * len(page.tokens) + len(PAGE_EXT) + len(TMP)


__all__ = ["Checkpoint", "Entry", "PageIn", "PageStore", "Refused", "read_header"]
