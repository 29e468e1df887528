"""The durable KV store's outcomes: what a boot's scan keeps and reaps (partial, corrupt, foreign
files; orphan pins only once old), a corrupt page never read as KV, a file that will not delete
set aside instead of wedging eviction, an all-pinned store saying the space is not there, and
writers killed mid-write leaving only whole pages and every pin."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.tiers.kv_store import PageIn, PageStore, Refused
from engine.tiers.store_files import page_key, page_path, page_rel
from engine.tiers.store_fs import StoreFS

ID = "model-a"


def opened(root: Path, identity: str = ID, **kw: object) -> tuple[PageStore, Receipts]:
    rec = Receipts(capture=True)
    store = PageStore(root, 1 << 20, identity, rec, **kw)  # type: ignore[arg-type]
    store.scan()
    return store, rec


def chain(n: int, size: int = 3000, identity: str = ID, start: int = 0) -> list[PageIn]:
    pages, parent = [], None
    for i in range(start, start + n):
        key = page_key(parent, [i, i + 1], identity)
        pages.append(PageIn(key, parent, [i, i + 1], bytes([i % 251]) * size))
        parent = key
    return pages


def test_scan_keeps_whole_pages_reaps_partial_and_foreign_files_and_sets_corrupt_ones_aside(
    tmp_path: Path,
) -> None:
    store, _ = opened(tmp_path)
    pages = chain(4)
    store.write(pages, reason="test")
    other, _ = opened(tmp_path / "elsewhere", identity="model-b")
    (foreign,) = chain(1, identity="model-b", start=50)
    other.write([foreign], reason="test")
    os.renames(page_path(tmp_path / "elsewhere", foreign.key), page_path(tmp_path, foreign.key))
    cut = page_path(tmp_path, pages[1].key)
    short = cut.read_bytes()[:-10]
    cut.write_bytes(short)  # a page cut short
    bad = page_path(tmp_path, pages[2].key)
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF  # a flipped payload byte: the header reads, the checksum will not
    bad.write_bytes(bytes(data))
    (page_path(tmp_path, pages[3].key).parent / "x.kv.123.tmp").write_bytes(b"half")
    again, rec = opened(tmp_path)
    (scan,) = rec.of(schema.STORE_SCAN)
    assert scan["reaped"] == {"foreign": 1, "partial": 1} and scan["set_aside"] == 1
    (q,) = rec.of(schema.STORE_QUARANTINE)
    assert q["path"] == f"pages/{pages[1].key[:2]}/{pages[1].key[2:4]}/{pages[1].key}.kv"
    assert q["reason"] == "malformed" and "payload of" in q["detail"]
    assert (tmp_path / q["moved_to"]).read_bytes() == short  # moved whole, never deleted
    assert sorted(again.entries) == sorted([pages[0].key, pages[2].key, pages[3].key])
    assert not page_path(tmp_path, pages[1].key).exists()
    # the flipped byte is found when the page is read: it is set aside, and nothing past it read
    assert again.read([p.key for p in pages[:3]]) == [pages[0].payload]  # stops where p1 is gone
    assert again.read([p.key for p in pages[2:]]) == []
    load = rec.of(schema.STORE_LOAD)[-1]
    assert load["pages"] == 0 and load["asked"] == 2 and "checksum" in load["error"]
    assert not again.has(pages[2].key)
    assert rec.of(schema.STORE_QUARANTINE)[-1]["reason"] == "checksum"
    assert again.used == sum(e.allocated for e in again.entries.values()) + sum(again.meta.values())


def test_an_orphan_pin_is_reaped_only_once_old(tmp_path: Path) -> None:
    now = [1000.0]
    store, _ = opened(tmp_path, clock=lambda: now[0], orphan_age_s=60)
    pages = chain(2)
    store.write(pages, reason="test")
    store.create_checkpoint("c1", [p.key for p in pages], 4)
    (tmp_path / "checkpoints" / "c1.json").unlink()  # the writer died before the manifest
    young, rec = opened(tmp_path, clock=lambda: time.time(), orphan_age_s=60)
    assert young.checkpoints["c1"].complete is False
    assert all(young.entries[p.key].pins == 1 for p in pages)  # its pins hold meanwhile
    assert rec.of(schema.STORE_REAP) == []
    old = time.time() - 120
    os.utime(tmp_path / "pins" / "c1.json", (old, old))
    aged, rec = opened(tmp_path, orphan_age_s=60)
    assert "c1" not in aged.checkpoints
    assert [r["reason"] for r in rec.of(schema.STORE_REAP)] == ["orphan_pin"]
    used = aged.used
    assert aged.reclaimable == used > 0  # its pages are evictable again
    assert aged.evict(used, reason="test") == used and aged.used == 0


def test_a_file_that_will_not_delete_is_set_aside_and_eviction_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, rec = opened(tmp_path, skip_budget=2)
    pages = chain(6)
    store.write(pages, reason="test")
    stuck = {page_rel(p.key) for p in pages[:3]}
    real = StoreFS.unlink

    def unlink(self: StoreFS, rel: str) -> None:
        if rel in stuck:
            raise PermissionError(13, "Operation not permitted", rel)
        real(self, rel)

    monkeypatch.setattr(StoreFS, "unlink", unlink)
    promised = store.reclaimable
    freed = store.evict(promised, reason="test")
    (ev,) = rec.of(schema.STORE_EVICT)
    assert (
        ev["skipped"] == 3 and "could not be deleted" in ev["error"]
    )  # budget 2: the third ends it
    assert freed == 0 and len(store.stuck) == 3
    assert store.reclaimable == promised - sum(store.entries[p.key].allocated for p in pages[:3])
    assert store.evict(store.reclaimable, reason="test") == promised - sum(
        store.entries[p.key].allocated for p in pages[:3]
    )  # the next call walks past nothing it set aside
    assert store.reclaimable == 0 and store.used > 0


def test_an_all_pinned_store_says_the_space_is_not_there(tmp_path: Path) -> None:
    store, rec = opened(tmp_path)
    pages = chain(3)
    store.write(pages, reason="test")
    store.create_checkpoint("c1", [p.key for p in pages], 6)
    assert store.reclaimable == 0
    assert store.evict(1 << 20, reason="test") == 0
    (ev,) = rec.of(schema.STORE_EVICT)
    assert ev["freed"] == 0 and ev["pinned_pages"] == 3 and ev["skipped"] == 0


def test_a_checkpoint_over_the_pin_budget_is_refused_with_four_numbers(tmp_path: Path) -> None:
    store, rec = opened(tmp_path, pin_budget=30000)
    pages = chain(4)
    store.write(pages, reason="test")
    first = store.create_checkpoint("a", [p.key for p in pages[:2]], 4)
    assert not isinstance(first, Refused)
    branch = store.create_checkpoint("b", [p.key for p in pages[:2]], 4)
    assert not isinstance(branch, Refused) and branch.pinned_bytes == 0
    before = (store.capacity(), sorted(os.listdir(tmp_path / "pins")))
    refused = store.create_checkpoint("c", [p.key for p in pages], 8)
    assert isinstance(refused, Refused)
    (r,) = rec.of(schema.CHECKPOINT_REFUSE)
    assert (r["want"], r["held"], r["budget"]) == (refused.want, store.pinned, 30000)
    assert r["overshoot"] == r["held"] + r["want"] - r["budget"] > 0
    assert (store.capacity(), sorted(os.listdir(tmp_path / "pins"))) == before
    store.delete_checkpoint("a")  # the sibling still pins the shared pages
    assert all(store.entries[p.key].pins == 1 for p in pages[:2])


def _full_of(tmp_path: Path, n: int) -> tuple[PageStore, Receipts]:
    """A store whose cap holds exactly ``n`` pages of ``chain``'s size."""
    measure, _ = opened(tmp_path / "measure")
    measure.write(chain(n, start=900), reason="test")
    rec = Receipts(capture=True)
    store = PageStore(tmp_path / "store", measure.used, ID, rec)
    store.scan()
    return store, rec


def test_the_room_a_checkpoint_makes_for_its_files_never_evicts_its_own_pages(
    tmp_path: Path,
) -> None:
    """A full store makes room for a checkpoint's two files by eviction, least recently used
    first, and the oldest page may be one the checkpoint is about to pin: it stays, and is
    pinned; the room comes from the others."""
    pages = chain(4)
    store, rec = _full_of(tmp_path, 4)
    assert store.write(pages, reason="test") == 4 and store.used == store.cap
    cp = store.create_checkpoint("c", [pages[0].key], 2)
    assert not isinstance(cp, Refused)
    assert store.has(pages[0].key) and store.entries[pages[0].key].pins == 1
    assert store.read([pages[0].key]) == [pages[0].payload]
    (ev,) = rec.of(schema.STORE_EVICT)
    assert ev["freed"] > 0 and ev["pinned_pages"] == 0  # the others paid, before the pin


def test_a_chain_written_into_a_full_store_never_evicts_its_own_head(tmp_path: Path) -> None:
    """A page is read only below its whole chain (``read`` stops at the first missing key), so
    the room for a later page of a chain never comes from an earlier one: a chain longer than
    the store keeps its head, and the pages past what fits are no_room."""
    store, rec = _full_of(tmp_path, 3)
    pages = chain(5)
    assert store.write(pages, reason="test") == 3
    assert store.read([p.key for p in pages]) == [p.payload for p in pages[:3]]
    (write,) = rec.of(schema.STORE_WRITE)
    assert (write["pages"], write["no_room"]) == (3, 2)
    # asked, and nothing of another chain was there to pay
    assert [e["pages"] for e in rec.of(schema.STORE_EVICT)] == [0, 0]


def test_a_chain_continued_keeps_its_stored_beginning(tmp_path: Path) -> None:
    """A chain's continuation, written later, pays with other chains' pages, never with the
    beginning it continues (the least recently used pages in a full store)."""
    store, rec = _full_of(tmp_path, 4)
    pages, other = chain(4), chain(2, start=100)
    store.write(pages[:2], reason="test")
    store.write(other, reason="test")  # newer than the chain's beginning
    before = len(rec.of(schema.STORE_EVICT))
    assert store.write(pages[2:], reason="test") == 2
    assert store.read([p.key for p in pages]) == [p.payload for p in pages]
    assert not store.has(other[0].key) and not store.has(other[1].key)
    assert [e["pages"] for e in rec.of(schema.STORE_EVICT)[before:]] == [1, 1]


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from engine.tiers.kv_store import PageIn, PageStore
    from engine.tiers.store_files import page_key
    from engine.observability.receipts import Receipts
    root, start = Path(sys.argv[1]), int(sys.argv[2])
    store = PageStore(root, 1 << 30, "model-a", Receipts())
    store.scan()
    parent = None
    for i in range(start, start + 100000):
        key = page_key(parent, [i], "model-a")
        store.write([PageIn(key, parent, [i], bytes([i % 251]) * 20000)], reason="test")
        if i % 7 == 0:
            store.create_checkpoint(f"c{i}", [key], 1)
        print(i, flush=True)
        parent = key
    """
)


def test_writers_killed_mid_write_leave_whole_pages_and_every_pin(tmp_path: Path) -> None:
    """SIGKILL a writer of pages and checkpoints again and again: each next scan reaps what was
    cut, keeps every whole page and every checkpoint, and every kept page reads back intact."""
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    start = 0
    for _round in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), str(start)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert proc.stdout is not None
        done = [int(proc.stdout.readline()) for _ in range(20 + 7 * _round)]
        proc.send_signal(signal.SIGKILL)  # somewhere in the middle of the next writes
        proc.wait()
        store, rec = opened(root)
        parent = None
        for i in range(start, done[-1] + 1):  # every page the writer said it wrote is kept
            parent = page_key(parent, [i], ID)
            assert store.has(parent)
        for key in store.entries:
            (payload,) = store.read([key])
            assert len(payload) == 20000
        for cp in store.checkpoints.values():
            assert all(store.has(k) and store.entries[k].pins for k in cp.keys)
        assert all("error" not in r for r in rec.of(schema.STORE_LOAD))
        assert store.used == sum(e.allocated for e in store.entries.values()) + sum(
            store.meta.values()
        )
        start += 1000
    assert len(store.checkpoints) >= 5
