"""The durable KV store's directory as an adversary makes it (hypothesis): on top of a store with
pages and a checkpoint, random entries at every level of its layout (``pages``, ``pins``,
``checkpoints``, ``quarantine``, the fan-out folders, page files, pins files, manifests, partial
files, names outside the layout): links to a victim directory outside the root or to a file in
it, hard links to the victim's files, FIFOs, folders where files belong, and garbage (random
bytes, cut pages, mistyped headers, deep JSON, a wrong token count, another model's page). The
victim is a store's leftovers, so a scan that followed a link would find things to reap there.

The boot's scan always completes (a FIFO would hang one that opened it), then the store writes,
reads, pins, unpins and evicts everything; nothing outside the root is changed or removed (the
victim's names and hashes before and after), every planted entry at a name of the layout is
set aside with a ``store.quarantine`` receipt naming it (or reaped: a partial file, a whole page
of another model), every entry in ``quarantine/`` has its receipt, and the ledger holds."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import tempfile
import threading
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.tiers.kv_store import PageStore, Refused
from engine.tiers.store_files import MAGIC, PageHeader, checksum, encode_page, page_key, page_rel
from tests.unit.test_kv_store_hostile import DEEP, chain, snapshot, victim_tree

ID = "model-a"
SLOTS = [
    "pages",
    "pins",
    "checkpoints",
    "quarantine",
    "fan1",
    "fan2",
    "fan1_new",
    "page",
    "page_new",
    "tmp",
    "pins_file",
    "manifest",
    "pins_new",
    "odd",
]
KINDS = [
    "link_dir",
    "link_file",
    "hardlink",
    "fifo",
    "folder",
    "garbage",
    "truncated",
    "mistyped",
    "deep",
    "wrong_tokens",
    "foreign",
]
FILE_SLOTS = {"page", "page_new", "tmp", "pins_file", "manifest", "pins_new"}


def _page_bytes(kind: str, key: str, noise: bytes) -> bytes:
    """The content of a page file of ``kind``, named for ``key``."""
    payload = noise or b"p"
    if kind == "garbage":
        return noise
    if kind == "foreign":
        fkey = page_key(None, [9, 9], "model-b")
        h = PageHeader(fkey, None, [9, 9], "model-b", len(payload), checksum(payload))
        return b"".join(bytes(x) for x in encode_page(h, payload))
    good = PageHeader(key, None, [1, 2], ID, len(payload), checksum(payload))._asdict()
    if kind == "truncated":
        whole = b"".join(bytes(x) for x in encode_page(PageHeader(**good), payload))
        return whole[: max(1, len(whole) * (len(noise) % 7 + 1) // 9)]
    if kind == "deep":
        head = DEEP
    else:
        field, bad = {
            "mistyped": ("payload", str(len(payload))),
            "wrong_tokens": ("tokens", [1, 2, 3]),
        }.get(kind, ("key", None))
        head = json.dumps({**good, field: bad}).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + payload


def _json_bytes(kind: str, noise: bytes, keys: list[str]) -> bytes:
    if kind == "deep":
        return DEEP
    if kind == "mistyped":
        return json.dumps(
            {
                "id": "c",
                "keys": ",".join(keys),
                "tokens": "abc",
                "pinned_bytes": 1,
                "shared_bytes": 0,
                "created": 1.0,
            }
        ).encode()
    if kind == "wrong_tokens":
        return json.dumps({"id": "c", "keys": [1, 2]}).encode()
    if kind == "truncated":
        return json.dumps({"id": "c", "keys": keys})[:-2].encode()
    return noise or b"\x00"


class Plant:
    def __init__(self, root: Path, victim: Path, store: PageStore, keys: list[str]) -> None:
        self.root, self.victim, self.keys = root, victim, keys
        self.cid = next(iter(store.checkpoints))
        self.planted: dict[str, str] = {}  # path -> kind

    def path(self, slot: str, i: int) -> str:
        k = self.keys[i % len(self.keys)]
        new = f"{i * 7919 % 65536:04x}" + k[4:]
        return {
            "pages": "pages",
            "pins": "pins",
            "checkpoints": "checkpoints",
            "quarantine": "quarantine",
            "fan1": f"pages/{k[:2]}",
            "fan2": f"pages/{k[:2]}/{k[2:4]}",
            "fan1_new": f"pages/{new[:2]}",
            "page": page_rel(k),
            "page_new": f"pages/{k[:2]}/{k[2:4]}/{k[:4]}{new[4:]}.kv",
            "tmp": f"pages/{k[:2]}/{k[2:4]}/{k}.kv.{i}.tmp",
            "pins_file": f"pins/{self.cid}.json",
            "manifest": f"checkpoints/{self.cid}.json",
            "pins_new": f"pins/new-{i}.json",
            "odd": f"pages/zz{i}",
        }[slot]

    def put(self, slot: str, kind: str, i: int, noise: bytes) -> None:
        rel = self.path(slot, i)
        p = self.root / rel
        parent = p.parent
        for up in [parent, *parent.parents]:  # never plant through a link planted before
            if up == self.root or self.root not in up.parents:
                break
            if up.is_symlink() or (up.exists() and not up.is_dir()):
                return
        parent.mkdir(parents=True, exist_ok=True)
        if slot == "quarantine" and kind == "folder":
            return  # a real quarantine folder is the store's own
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)
        self.planted = {r: k for r, k in self.planted.items() if not r.startswith(rel + "/")}
        self._make(p, slot, kind, noise)
        self.planted[rel] = kind

    def _make(self, p: Path, slot: str, kind: str, noise: bytes) -> None:
        if kind == "link_dir":
            p.symlink_to(self.victim / "ab", target_is_directory=True)
        elif kind == "link_file":
            p.symlink_to(self.victim / "ab" / "x.kv.1.tmp")
        elif kind == "hardlink":
            os.link(self.victim / "notes.txt", p)
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind == "folder":
            (p / "inner").mkdir(parents=True)
            (p / "inner.kv").write_bytes(b"x")
        elif slot not in FILE_SLOTS:
            p.write_bytes(noise or b"x")  # a file where a folder belongs
        elif slot in ("pins_file", "manifest", "pins_new"):
            p.write_bytes(_json_bytes(kind, noise, self.keys))
        else:
            p.write_bytes(_page_bytes(kind, p.name.split(".")[0], noise))


def _scan(store: PageStore, root: Path) -> None:
    """The scan, in a thread: a scan that opened a FIFO would wait for ever."""
    err: list[BaseException] = []

    def run() -> None:
        try:
            store.scan()
        except BaseException as e:  # reported below
            err.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)  # a deadline far from the scan's milliseconds
    if t.is_alive():
        for dirpath, _, names in os.walk(root):
            for n in names:
                if stat.S_ISFIFO(os.lstat(Path(dirpath) / n).st_mode):
                    os.close(os.open(Path(dirpath) / n, os.O_WRONLY | os.O_NONBLOCK))
        raise AssertionError("the scan did not complete: it waited on a FIFO")
    if err:
        raise err[0]


plants = st.lists(
    st.tuples(
        st.sampled_from(SLOTS), st.sampled_from(KINDS), st.integers(0, 50), st.binary(max_size=64)
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plants=plants)
def test_an_adversarys_store_directory_touches_nothing_outside_and_every_set_aside_is_said(
    plants: list[tuple[str, str, int, bytes]],
) -> None:
    top = Path(tempfile.mkdtemp(prefix="kvstore-fuzz-"))
    try:
        _check(top, plants)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _check(top: Path, plants: list[tuple[str, str, int, bytes]]) -> None:
    root, victim = top / "store", top / "victim"
    victim_tree(victim)
    store = PageStore(root, 1 << 20, ID, Receipts())
    store.scan()
    pages = chain(4)
    store.write(pages, reason="test")
    assert not isinstance(store.create_checkpoint("c", [p.key for p in pages[:2]], 4), Refused)
    plant = Plant(root, victim, store, [p.key for p in pages])
    for slot, kind, i, noise in plants:
        plant.put(slot, kind, i, noise)
    before = snapshot(victim)
    rec = Receipts(capture=True)
    again = PageStore(root, 1 << 20, ID, rec)
    _scan(again, root)
    said = {r["path"]: r for r in rec.of(schema.STORE_QUARANTINE)}
    reaped = rec.of(schema.STORE_SCAN)[0]["reaped"]
    for rel, kind in plant.planted.items():
        if rel.startswith("pages/zz") or rel == "quarantine":
            continue  # a name outside the layout, and the store's own folder: left alone
        if (
            kind == "folder"
            and rel.count("/") < 3
            and not rel.startswith(("pins/", "checkpoints/"))
        ):
            continue  # a folder where the store keeps one
        gone = not os.path.lexists(root / rel)
        if rel in said:
            continue
        assert gone, f"{kind} at {rel} neither set aside nor reaped ({plants})"
        assert (rel.endswith(".tmp") and reaped.get("partial")) or (
            kind == "foreign" and reaped.get("foreign")
        ), f"{kind} at {rel} went without a receipt"
    q = root / "quarantine"
    if q.is_dir() and not q.is_symlink():
        moved = {r["moved_to"] for r in said.values() if "moved_to" in r}
        assert {f"quarantine/{n}" for n in os.listdir(q)} == moved
    # the store goes on over what is left: writes, reads, pins, unpins, evicts everything
    more = chain(3, start=100) + pages
    again.write(more, reason="test")
    again.read([p.key for p in more])
    keys = [p.key for p in more if again.has(p.key)]
    try:  # its files may have nowhere to go (a link at pins/ that could not be set aside)
        if keys and not isinstance(again.create_checkpoint("d", keys[:1], 2), Refused):
            again.delete_checkpoint("d")
    except OSError:
        pass
    again.evict(again.used, reason="test")
    assert snapshot(victim) == before
    assert again.used == sum(e.allocated for e in again.entries.values()) + sum(again.meta.values())
