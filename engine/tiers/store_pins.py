"""The durable KV store's checkpoints on disk: a checkpoint pins the pages it references under
its id, in two files, ``pins/ID.json`` (written first, listing its pages) and
``checkpoints/ID.json`` (its manifest, written last); the next boot counts pins from the files.

Making one: the pages it pins reach the disk first (``fsync`` of each page file and of the
folders that hold them, never the whole host's ``sync``), then its pins file and its manifest,
each flushed with its folder. A checkpoint whose new pinned bytes would cross the pin budget is
refused with four numbers (want, held, budget, overshoot) and changes nothing. Removing one:
the manifest first, then the pins (a crash between leaves an orphan pins file, reaped once old);
a file that cannot be removed is an ``Undeletable`` error and a ``checkpoint.delete_failed``
receipt, never a crash: with its manifest still there nothing changed; with its manifest gone
it is listed incomplete and its pins hold until its pins file can go.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Collection
from typing import NamedTuple

from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.tiers.store_books import StoreBooks
from engine.tiers.store_files import allocated_bytes, page_rel
from engine.tiers.store_fs import StoreFS
from engine.tiers.store_scan import Checkpoint

FULL = (errno.ENOSPC, errno.EDQUOT)  # a disk (or a quota) with no room left


class Refused(NamedTuple):
    """A checkpoint the pin budget cannot hold: the four numbers, in allocated bytes."""

    want: int
    held: int
    budget: int
    overshoot: int


class Undeletable(OSError):
    """A checkpoint whose files could not be removed (the path and the error in words)."""


class CheckpointStore(StoreBooks):
    """Checkpoints over the books. A subclass gives ``fs``, ``receipts``, ``clock``,
    ``pin_budget``, ``_unit`` (the filesystem's allocation unit), ``evict`` and ``_room``
    (eviction that makes room under the cap, sparing ``keep``)."""

    fs: StoreFS
    receipts: Receipts
    clock: Callable[[], float]
    pin_budget: int
    _unit: int

    def _room(self, size: int, rid: str | None, keep: Collection[str] = ()) -> bool:
        raise NotImplementedError

    def evict(
        self, need: int, reason: str, rid: str | None = None, keep: Collection[str] = ()
    ) -> int:
        raise NotImplementedError

    def disk_free(self) -> int:
        """Bytes free for the store on its filesystem now."""
        try:
            v = os.statvfs(self.fs.root)
        except OSError:
            return 0
        return v.f_bavail * v.f_frsize

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
        pins_rel, manifest_rel = self._paths(cid)
        pins = json.dumps({"id": cid, "keys": keys}).encode()
        manifest = json.dumps(cp._asdict()).encode()
        files = self._charged(len(pins)) + self._charged(len(manifest))
        refused = self._over_budget(cid, tokens, pages + files)
        if refused is not None:
            return refused
        own = frozenset(keys)
        if not self._room(files, None, keep=own):  # its own pages stay
            raise OSError(f"checkpoint {cid}: no room for its files under the store's cap")
        self.fs.sync(page_rel(k) for k in dict.fromkeys(keys))  # on disk before they are pinned
        self._meta(pins_rel, allocated_bytes(self._write(pins_rel, pins, own)))
        self._pin(cp)
        try:
            self._meta(manifest_rel, allocated_bytes(self._write(manifest_rel, manifest, own)))
        except OSError:
            try:
                self.delete_checkpoint(cid, say=False)
            except OSError:
                pass  # its pins file stays: the next boot reaps it as an orphan
            raise
        self.receipts.emit(
            schema.CHECKPOINT_CREATE,
            id=cid,
            tokens=tokens,
            pages=len(keys),
            pinned_bytes=pages,
            shared_bytes=shared,
            file_bytes=files,
            **self.capacity(),
        )
        return cp

    def _write(self, rel: str, data: bytes, keep: Collection[str]) -> os.stat_result:
        """A checkpoint's file written and flushed (room made on a full disk, ``write_room``)."""
        return self.write_room(rel, data, self._charged(len(data)), keep, sync=True)

    def write_room(
        self,
        rel: str,
        data: bytes | list,
        need: int,
        keep: Collection[str],
        rid: str | None = None,
        sync: bool = False,
    ) -> os.stat_result:
        """``data`` written at ``rel``; on a full disk (or quota), room made as a full cap
        makes it (eviction of ``need`` bytes, sparing ``keep``) and the write tried once more;
        still full, an OSError that says so with the disk's free bytes."""
        try:
            return self.fs.write_atomic(rel, data, sync=sync)
        except OSError as e:
            if e.errno not in FULL:
                raise
        freed = self.evict(need, reason="disk_full", rid=rid, keep=keep)
        try:
            return self.fs.write_atomic(rel, data, sync=sync)
        except OSError as again:
            if again.errno not in FULL:
                raise
            raise OSError(
                again.errno,
                f"the disk under the store is full ({self.disk_free()} bytes free, "
                f"{rel} needs {need}; eviction freed {freed})",
            ) from again

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
        """Remove the manifest first, then the pins: a crash between leaves an orphan, reaped.
        Raises Undeletable (and writes ``checkpoint.delete_failed``) for a file that will not
        go: with the manifest still there nothing changed; past it the checkpoint is kept,
        incomplete, its pins held until its pins file goes."""
        cp = self.checkpoints.get(cid)
        if cp is None:
            return None
        pins, manifest = self._paths(cid)
        for rel in (manifest, pins):
            try:
                self.fs.unlink(rel)
            except OSError as e:
                raise self._undeletable(cp, rel, e) from e
            self._meta(rel, None)
        self._unpin(cp)
        if say:
            self.receipts.emit(
                schema.CHECKPOINT_DELETE,
                id=cid,
                tokens=cp.tokens,
                pages=len(cp.keys),
                **self.capacity(),
            )
        return cp

    def _undeletable(self, cp: Checkpoint, rel: str, e: OSError) -> Undeletable:
        if rel.startswith("checkpoints/"):  # the manifest: nothing changed
            left = "nothing changed"
        else:  # the manifest is gone: incomplete from now on, its pins held
            self.checkpoints[cp.id] = cp._replace(complete=False)
            left = "its manifest is removed: it is incomplete, its pages still pinned"
        error = f"{type(e).__name__}: {e.strerror or e}"
        self.receipts.emit(schema.CHECKPOINT_DELETE_FAILED, id=cp.id, path=rel, error=error)
        return Undeletable(
            e.errno, f"checkpoint {cp.id}: {rel} could not be removed ({error}); {left}"
        )

    def _paths(self, cid: str) -> tuple[str, str]:
        return f"pins/{cid}.json", f"checkpoints/{cid}.json"
