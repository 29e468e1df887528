"""The durable KV store when its disk misbehaves: a pinned page that fails its checksum, a
checkpoint whose files will not be removed, a full disk (ENOSPC), and what a checkpoint flushes
to make its pages durable (their files and folders, never the whole host's ``sync``)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from engine.observability import schema
from engine.tiers.kv_store import Refused, Undeletable
from engine.tiers.store_files import page_path
from engine.tiers.store_fs import StoreFS
from tests.unit.test_kv_store_hostile import chain, opened


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_pinned_page_that_fails_its_checksum_uncompletes_its_checkpoint_and_stays_pinned(
    tmp_path: Path,
) -> None:
    store, rec = opened(tmp_path)
    pages = chain(3)
    store.write(pages, reason="test")
    store.create_checkpoint("c", [p.key for p in pages], 6)
    _flip(page_path(tmp_path, pages[1].key))
    assert store.read([p.key for p in pages]) == [pages[0].payload]
    (q,) = rec.of(schema.STORE_QUARANTINE)
    assert q["reason"] == "checksum" and q["checkpoints"] == ["c"]
    assert store.missing(store.checkpoints["c"]) == 1  # listed incomplete from now on
    # the page computed again and written: pinned at once, never evictable meanwhile
    store.write([pages[1]], reason="test")
    assert store.entries[pages[1].key].pins == 1 and pages[1].key not in store.lru
    store.evict(store.used, reason="test")
    assert store.has(pages[1].key) and store.missing(store.checkpoints["c"]) == 0
    assert store.pinned + store.reclaimable == store.used


def test_a_manifest_that_will_not_go_is_an_error_and_changes_nothing(tmp_path: Path) -> None:
    store, rec = opened(tmp_path)
    pages = chain(2)
    store.write(pages, reason="test")
    store.create_checkpoint("c", [p.key for p in pages], 4)
    before = store.capacity()
    manifest = tmp_path / "checkpoints" / "c.json"
    manifest.unlink()
    (manifest / "held").mkdir(parents=True)  # a folder with something in it: no unlink removes it
    with pytest.raises(Undeletable, match="checkpoints/c.json could not be removed"):
        store.delete_checkpoint("c")
    (f,) = rec.of(schema.CHECKPOINT_DELETE_FAILED)
    assert f["id"] == "c" and f["path"] == "checkpoints/c.json" and "directory" in f["error"]
    assert store.checkpoints["c"].complete and store.capacity() == before
    assert rec.of(schema.CHECKPOINT_DELETE) == []


def test_a_pins_file_that_will_not_go_leaves_the_checkpoint_incomplete_and_pinned(
    tmp_path: Path,
) -> None:
    store, rec = opened(tmp_path)
    pages = chain(2)
    store.write(pages, reason="test")
    store.create_checkpoint("c", [p.key for p in pages], 4)
    pins = tmp_path / "pins" / "c.json"
    pins.unlink()
    (pins / "held").mkdir(parents=True)
    with pytest.raises(Undeletable, match="pins/c.json could not be removed"):
        store.delete_checkpoint("c")
    assert store.checkpoints["c"].complete is False
    assert all(store.entries[p.key].pins == 1 for p in pages)
    (pins / "held").rmdir()
    pins.rmdir()
    assert store.delete_checkpoint("c") is not None  # the retry finishes it
    assert store.reclaimable == store.used - store.pinned and "c" not in store.checkpoints


def _full_once(monkeypatch: pytest.MonkeyPatch, times: int) -> list[str]:
    """The next ``times`` writes fail with ENOSPC; returns the paths they were for."""
    real, failed = StoreFS.write_atomic, []

    def write(self: StoreFS, rel: str, data: object, sync: bool = False) -> os.stat_result:
        if len(failed) < times:
            failed.append(rel)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, rel, data, sync)  # type: ignore[arg-type]

    monkeypatch.setattr(StoreFS, "write_atomic", write)
    return failed


def test_a_full_disk_makes_room_by_eviction_and_the_write_goes_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, rec = opened(tmp_path)
    old = chain(3, start=50)
    store.write(old, reason="test")
    failed = _full_once(monkeypatch, 1)
    (page,) = chain(1)
    assert store.write([page], reason="test") == 1 and store.has(page.key)
    assert len(failed) == 1
    (ev,) = rec.of(schema.STORE_EVICT)
    assert ev["reason"] == "disk_full" and ev["freed"] > 0 and ev["pages"] == 1
    assert not store.has(old[0].key)  # the least recently used page paid
    assert "error" not in rec.of(schema.STORE_WRITE)[-1] and store.short is None


def test_a_disk_that_stays_full_is_said_as_a_full_disk_with_the_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, rec = opened(tmp_path)
    store.write(chain(3, start=50), reason="test")
    failed = _full_once(monkeypatch, 1000)
    assert store.write(chain(2), reason="test") == 0
    assert len(failed) == 4  # each page: a write, room made, one retry
    w = rec.of(schema.STORE_WRITE)[-1]
    assert "disk under the store is full" in w["error"] and "bytes free" in w["error"]
    assert store.short is not None and "full" in store.short
    assert "cap" not in w["error"]


def test_a_checkpoint_file_on_a_full_disk_makes_room_then_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, rec = opened(tmp_path)
    pages, other = chain(2), chain(2, start=60)
    store.write(other + pages, reason="test")
    _full_once(monkeypatch, 1)  # the pins file's first try
    assert not isinstance(store.create_checkpoint("c", [p.key for p in pages], 4), Refused)
    (ev,) = rec.of(schema.STORE_EVICT)
    assert ev["reason"] == "disk_full" and all(store.has(p.key) for p in pages)
    _full_once(monkeypatch, 1000)
    with pytest.raises(OSError, match="disk under the store is full") as e:
        store.create_checkpoint("d", [pages[0].key], 2)
    assert e.value.errno == errno.ENOSPC and "d" not in store.checkpoints


def test_a_checkpoint_flushes_its_own_files_and_folders_and_never_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = opened(tmp_path)
    pages = chain(3)
    store.write(pages, reason="test")

    def sync() -> None:
        raise AssertionError("os.sync flushes every file system of the host")

    flushed: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "sync", sync)
    monkeypatch.setattr(os, "fsync", fsync)
    store.create_checkpoint("c", [p.key for p in pages[:2]], 4)
    want = {str(page_path(tmp_path, p.key)) for p in pages[:2]}
    want |= {str(page_path(tmp_path, p.key).parent) for p in pages[:2]}
    want |= {str(tmp_path / "pages"), str(tmp_path)}
    want |= {str(tmp_path / d) for d in ("pins", "checkpoints")}
    assert want <= set(flushed)
    for d in ("pins", "checkpoints"):  # flushed under its temporary name, before its rename
        assert any(f.startswith(str(tmp_path / d / "c.json.")) for f in flushed)
    assert str(page_path(tmp_path, pages[2].key)) not in flushed  # not this checkpoint's


def test_a_page_the_cap_cannot_take_is_said_as_the_cap_not_the_disk(tmp_path: Path) -> None:
    store, _ = opened(tmp_path, pin_budget=1 << 20)
    pages = chain(3, size=200_000)
    store.write(pages, reason="test")
    store.create_checkpoint("c", [p.key for p in pages if store.has(p.key)], 6)
    assert store.write(chain(2, size=300_000, start=40), reason="test") == 1  # one fits
    assert store.short is not None and store.short.startswith("no room under its cap")
    assert f"of {store.cap} bytes used" in store.short
