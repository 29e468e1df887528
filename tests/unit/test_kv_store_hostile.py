"""The durable KV store's directory as someone else made it: links to a directory outside the
store (at every level of its layout), a FIFO named like a page, files whose headers or JSON are
malformed or mistyped. The boot's scan completes, follows no link, opens nothing that is not a
regular file, changes nothing outside the store's root, and sets every malformed file aside
(``quarantine/``) with a ``store.quarantine`` receipt naming it and why."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from pathlib import Path

import pytest

from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.tiers.kv_store import PageStore
from engine.tiers.store_files import MAGIC, page_key, page_path
from tests.unit.test_kv_store import ID, chain, opened

OLD = time.time() - 10 * 86400  # older than any orphan age


def raw_page(header: object, payload: bytes = b"x" * 64) -> bytes:
    """A page file with ``header`` as its JSON, whatever it holds."""
    head = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return MAGIC + struct.pack("<I", len(head)) + head + payload


def good_header(key: str, payload: bytes, identity: str = ID) -> dict:
    return {
        "key": key,
        "parent": None,
        "tokens": [1, 2],
        "identity": identity,
        "payload": len(payload),
        "checksum": hashlib.blake2b(payload, digest_size=16).hexdigest(),
    }


def victim_tree(victim: Path) -> None:
    """A directory outside the store that looks like a store's leftovers to a scan that follows
    links: partial files, pages of another model, corrupt pages, old pins with no manifest."""
    (foreign,) = chain(1, identity="model-b", start=70)
    for sub in ("", "ab", "ab/cd"):
        d = victim / sub
        d.mkdir(parents=True, exist_ok=True)
        (d / "x.kv.1.tmp").write_bytes(b"half a page")
        (d / f"{foreign.key}.kv").write_bytes(
            raw_page(good_header(foreign.key, b"y" * 64, "model-b"), b"y" * 64)
        )
        (d / ("0" * 32 + ".kv")).write_bytes(b"not a page at all")
        (d / "orphan.json").write_bytes(json.dumps({"id": "orphan", "keys": []}).encode())
        (d / "notes.txt").write_bytes(b"the victim's own file")
    for p in victim.rglob("*"):
        os.utime(p, (OLD, OLD), follow_symlinks=False)


def snapshot(top: Path) -> dict[str, str]:
    """Every entry under ``top`` by its relative name: a file's hash, or what it is."""
    out = {}
    for dirpath, dirs, names in os.walk(top):
        for name in dirs + names:
            p = Path(dirpath) / name
            rel = str(p.relative_to(top))
            out[rel] = (
                hashlib.sha256(p.read_bytes()).hexdigest()
                if p.is_file() and not p.is_symlink()
                else "dir-or-link"
            )
    return out


LINKED = ["pages", "pins", "checkpoints", "pages/ab", "pages/ab/cd"]


@pytest.mark.parametrize("where", LINKED)
def test_a_linked_folder_of_the_store_is_never_followed(tmp_path: Path, where: str) -> None:
    victim, root = tmp_path / "victim", tmp_path / "store"
    victim_tree(victim)
    before = snapshot(victim)
    store, _ = opened(root)
    store.write(chain(3), reason="test")
    link = root / where
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.exists():
        import shutil

        shutil.rmtree(link)
    link.symlink_to(victim, target_is_directory=True)
    again, rec = opened(root, orphan_age_s=60)
    again.write(chain(3, start=20), reason="test")
    again.evict(again.used, reason="test")
    assert snapshot(victim) == before
    (q,) = [r for r in rec.of("store.quarantine") if r["path"] == where]
    assert q["reason"] == "wrong_type" and "link" in q["detail"]
    assert not link.is_symlink()  # set aside: the store's own folder can be made there


def test_a_fifo_named_like_a_page_is_never_opened(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store, _ = opened(root)
    (page,) = chain(1)
    fifo = page_path(root, page.key)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    done: list[PageStore] = []
    t = threading.Thread(target=lambda: done.append(opened(root)[0]), daemon=True)
    t.start()
    t.join(60)  # a deadline far from the scan's few milliseconds
    if not done:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the stuck scan go
    assert done, "the scan opened a FIFO named like a page and waited on it"


def test_a_link_at_a_page_name_is_set_aside_never_read_and_its_target_kept(tmp_path: Path) -> None:
    victim, root = tmp_path / "victim", tmp_path / "store"
    victim.mkdir()
    (victim / "secret").write_bytes(b"not a page")
    os.utime(victim / "secret", (OLD, OLD))
    before = snapshot(victim)
    opened(root)
    (page,) = chain(1)
    link = page_path(root, page.key)
    link.parent.mkdir(parents=True)
    link.symlink_to(victim / "secret")
    tmp_link = link.parent / "y.kv.9.tmp"
    tmp_link.symlink_to(victim / "secret")
    again, rec = opened(root)
    assert sorted(q["reason"] for q in rec.of("store.quarantine")) == ["wrong_type"] * 2
    again.write([page], reason="test")  # its own page now, where the link was
    assert again.read([page.key]) == [page.payload]
    assert snapshot(victim) == before


def test_a_hard_link_is_never_read_as_a_page(tmp_path: Path) -> None:
    """The store writes by rename: its files have one link. A second name for a file elsewhere
    is set aside (the name moved, the file's content untouched)."""
    root = tmp_path / "store"
    store, _ = opened(root)
    (page,) = chain(1)
    store.write([page], reason="test")
    elsewhere = tmp_path / "copy.kv"
    os.link(page_path(root, page.key), elsewhere)
    again, rec = opened(root)
    (q,) = rec.of("store.quarantine")
    assert q["reason"] == "wrong_type" and "2 hard links" in q["detail"]
    assert not again.has(page.key) and elsewhere.exists()


def _page_with(root: Path, header: object, name: str | None = None) -> str:
    key = name or page_key(None, [1, 2], ID)
    path = page_path(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw_page(header))
    return str(path.relative_to(root))


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    "header",
    [
        {"tokens": "abc"},
        {"tokens": [1, 2, 3]},  # a wrong token count: its key is not its tokens' key
        {"tokens": [True, 2]},
        {"payload": "64"},
        {"parent": 5},
        {"identity": None},
        {"checksum": 7},
        {"extra": 1},
        "deep",
        "list",
    ],
    ids=[
        "tokens-abc",
        "wrong-token-count",
        "token-bool",
        "payload-str",
        "parent-int",
        "identity-null",
        "checksum-int",
        "extra-field",
        "deep",
        "list",
    ],
)
def test_a_malformed_page_header_is_set_aside_and_the_boot_goes_on(
    tmp_path: Path, header: object
) -> None:
    key = page_key(None, [1, 2], ID)
    base = good_header(key, b"x" * 64)
    if header == "deep":
        head: object = DEEP
    elif header == "list":
        head = [base]
    else:
        head = {**base, **header}  # type: ignore[dict-item]
    root = tmp_path / "store"
    good = chain(2, start=40)
    store, _ = opened(root)
    store.write(good, reason="test")
    rel = _page_with(root, head, key)
    again, rec = opened(root)
    (q,) = rec.of("store.quarantine")
    assert (q["path"], q["reason"]) == (rel, "malformed")
    assert (root / q["moved_to"]).exists() and not (root / rel).exists()
    assert sorted(again.entries) == sorted(p.key for p in good)
    assert rec.of(schema.STORE_SCAN)[0]["set_aside"] == 1
    _, rec = opened(root)  # set aside once: the next boot is clean
    assert rec.of("store.quarantine") == []


@pytest.mark.parametrize(
    "pins,manifest",
    [
        ({"id": "c", "keys": "KEYS"}, {"tokens": "abc"}),  # the finding: tokens a string
        ({"id": "c", "keys": "KEYS"}, {"tokens": 4, "pinned_bytes": None}),
        ({"id": "c", "keys": "KEYS"}, "deep"),
        ("deep", None),
        ({"id": "c", "keys": [1, 2]}, None),
        ({"id": "c", "keys": "KEYS"}, [1]),
    ],
    ids=["tokens-abc", "pinned-null", "deep-manifest", "deep-pins", "keys-ints", "manifest-list"],
)
def test_a_malformed_checkpoint_is_set_aside_whole_and_the_boot_goes_on(
    tmp_path: Path, pins: object, manifest: object
) -> None:
    root = tmp_path / "store"
    store, _ = opened(root)
    pages = chain(2)
    store.write(pages, reason="test")
    store.create_checkpoint("c", [p.key for p in pages], 4)
    store.create_checkpoint("ok", [pages[0].key], 2)
    good = json.loads((root / "checkpoints" / "c.json").read_bytes())

    def body(v: object) -> bytes:
        if v == "deep":
            return DEEP
        if isinstance(v, dict) and v.get("keys") == "KEYS":
            v = {**v, "keys": [p.key for p in pages]}
        if isinstance(v, dict) and "tokens" in v:
            v = {**good, **v}
        return json.dumps(v).encode()

    (root / "pins" / "c.json").write_bytes(body(pins))
    if manifest is not None:
        (root / "checkpoints" / "c.json").write_bytes(body(manifest))
    again, rec = opened(root)
    assert set(again.checkpoints) == {"ok"}
    assert (
        sorted(q["path"] for q in rec.of("store.quarantine"))
        == ["checkpoints/c.json", "pins/c.json"]
        if manifest is not None
        else ["pins/c.json"]
    )
    assert again.entries[pages[0].key].pins == 1 and again.entries[pages[1].key].pins == 0
    assert again.used == sum(e.allocated for e in again.entries.values()) + sum(again.meta.values())


@pytest.mark.parametrize("kind", ["link", "fifo", "folder", "deep"])
def test_a_store_json_the_store_did_not_write_is_never_read_and_said(
    tmp_path: Path, kind: str
) -> None:
    victim, root = tmp_path / "victim", tmp_path / "store"
    victim.mkdir()
    (victim / "id.json").write_bytes(json.dumps({"identity": ID}).encode())
    before = snapshot(victim)
    root.mkdir()
    ident = root / "STORE.json"
    if kind == "link":
        ident.symlink_to(victim / "id.json")
    elif kind == "fifo":
        os.mkfifo(ident)
    elif kind == "folder":
        (ident / "x").mkdir(parents=True)
    else:
        ident.write_bytes(DEEP)
    store = PageStore(root, 1 << 20, ID, Receipts(capture=True))
    done: list[str | None] = []
    t = threading.Thread(target=lambda: done.append(store.claim()), daemon=True)
    t.start()
    t.join(60)
    if not done:
        os.close(os.open(ident, os.O_WRONLY | os.O_NONBLOCK))
    assert done and done[0] is not None and str(root) in done[0]
    assert snapshot(victim) == before
