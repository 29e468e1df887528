"""Reading a durable KV store's directory back at boot: which page files are whole pages of this
model, which checkpoints exist and what they pin, what is to be reaped and what set aside (and
why). Decides only; ``PageStore.scan`` acts on the decisions.

The scan walks the store's own layout and nothing else (``pages/XX/YY/KEY.kv``, ``pins/ID.json``,
``checkpoints/ID.json``), through ``store_fs`` (no link followed, only regular files of one link
opened). Names outside that layout are left alone, never opened, never counted. Reads headers
only (a page's payload is checked against its checksum when it is loaded), so a scan costs one
small read per file.

Reaped (deleted) are only files the store wrote and has no use for: ``partial`` (a temporary
file a crash left), ``foreign`` (a whole page another model wrote), ``orphan_pin`` (a pins file
whose checkpoint never got its manifest, older than the orphan age), ``orphan_manifest`` (a
manifest whose pins are gone). Set aside (moved to ``quarantine/``, ``store.quarantine``) is
anything at a name of the layout that the store did not write as it is: ``wrong_type`` (a link,
FIFO, socket, device, a folder where a file belongs or a file where a folder belongs),
``malformed`` (a header or JSON that is not what the store writes: types, its key, its length;
a checkpoint's two files go together), ``unreadable`` (an error reading it).
"""

from __future__ import annotations

import math
import os
import re
import stat
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from engine.tiers.store_files import (
    PAGE_EXT,
    PageHeader,
    StoreFileError,
    allocated_bytes,
    is_key,
    load_json,
    page_rel,
    read_header,
)
from engine.tiers.store_fs import (
    TMP,
    NotAStoreFile,
    StoreFS,
    entries_at,
    is_store_file,
    open_at,
    what,
)

Reaped = list[tuple[str, int, int]]  # path, allocated bytes, apparent bytes
FAN = re.compile(r"[0-9a-f]{2}")  # a fan-out folder's name
CID = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
)  # a checkpoint's id (engine/tiers/checkpoints.py)
MAX_JSON = 64 << 20  # a longer pins file or manifest is not one this store wrote
_MANIFEST = ("tokens", "pinned_bytes", "shared_bytes")


class Checkpoint(NamedTuple):
    id: str
    keys: tuple[str, ...]
    tokens: int
    pinned_bytes: int  # pinned by this checkpoint alone when it was made
    shared_bytes: int  # already pinned by another when it was made
    created: float
    complete: bool = True  # False: its pins are written, its manifest not yet


class Aside(NamedTuple):
    """A name the scan sets aside: its path, the reason's word and the reason in words."""

    path: str
    reason: str
    detail: str


@dataclass(slots=True)
class Scanned:
    files: int = 0
    apparent: int = 0
    pages: list[tuple[str, PageHeader, os.stat_result]] = field(default_factory=list)
    meta: dict[str, int] = field(default_factory=dict)  # checkpoint files kept: allocated bytes
    checkpoints: list[Checkpoint] = field(default_factory=list)
    reaped: dict[str, Reaped] = field(default_factory=dict)
    aside: list[Aside] = field(default_factory=list)
    seconds: float = 0.0

    def reap(self, reason: str, path: str, st: os.stat_result) -> None:
        self.reaped.setdefault(reason, []).append((path, allocated_bytes(st), st.st_size))

    def set_aside(self, path: str, reason: str, detail: str) -> None:
        self.aside.append(Aside(path, reason, detail))


def _folders(fs: StoreFS, found: Scanned, rel: str, names: re.Pattern[str]) -> list[str]:
    """The folders of ``rel`` whose names ``names`` matches; anything else at such a name is
    set aside. A folder that cannot be listed is set aside when it is not a folder."""
    out = []
    for name, st in _entries(fs, found, rel):
        if not names.fullmatch(name):
            continue  # not a name of the store's: left alone
        path = f"{rel}/{name}" if rel else name
        if stat.S_ISDIR(st.st_mode):
            out.append(path)
        else:
            found.set_aside(path, "wrong_type", f"{what(st)} where the store keeps a folder")
    return out


def _entries(fs: StoreFS, found: Scanned, rel: str) -> list[tuple[str, os.stat_result]]:
    try:
        return fs.entries(rel)
    except OSError as e:
        try:
            st = fs.lstat(rel)
        except OSError:
            return []  # gone, or above it is not the store's: its own check said so
        if not stat.S_ISDIR(st.st_mode):
            found.set_aside(rel, "wrong_type", f"{what(st)} where the store keeps a folder")
        else:
            found.set_aside(rel, "unreadable", f"{type(e).__name__}: {e}")
        return []


def _file(found: Scanned, rel: str, st: os.stat_result, ext: str) -> bool:
    """Sort out the names every folder of files shares: whether ``rel`` is a file of the store's
    kind (``ext``) to read. A ``*.tmp`` regular file is a partial write, reaped."""
    if rel.endswith(TMP):
        if is_store_file(st):
            found.reap("partial", rel, st)
        else:
            found.set_aside(rel, "wrong_type", f"{what(st)} named like a partial write")
        return False
    if not rel.endswith(ext):
        return False  # not a name of the store's: left alone
    if not is_store_file(st):
        found.set_aside(rel, "wrong_type", f"{what(st)} where the store keeps a file")
        return False
    found.files += 1
    found.apparent += st.st_size
    return True


def _pages(fs: StoreFS, found: Scanned, identity: str) -> None:
    for top in _folders(fs, found, "", re.compile("pages")):
        for mid in _folders(fs, found, top, FAN):
            for leaf in _folders(fs, found, mid, FAN):
                try:
                    with fs.folder(leaf) as d:
                        for name, st in entries_at(d):
                            if _file(found, f"{leaf}/{name}", st, PAGE_EXT):
                                _page(found, d, f"{leaf}/{name}", identity)
                except OSError as e:  # swapped for a link since it was listed
                    found.set_aside(leaf, "unreadable", f"{type(e).__name__}: {e}")


def _page(found: Scanned, d: int, rel: str, identity: str) -> None:
    try:
        with open_at(d, rel.rpartition("/")[2], rel) as (fh, st):
            header = read_header(fh, st.st_size, rel)
    except StoreFileError as e:
        found.set_aside(rel, "malformed", str(e))
        return
    except NotAStoreFile as e:
        found.set_aside(rel, "wrong_type", str(e))
        return
    except FileNotFoundError:
        return
    except OSError as e:
        found.set_aside(rel, "unreadable", f"{type(e).__name__}: {e}")
        return
    if header.identity != identity:
        found.reap("foreign", rel, st)
    elif page_rel(header.key) != rel:
        found.set_aside(rel, "malformed", f"{rel} holds page {header.key}")
    else:
        found.pages.append((header.key, header, st))


def _json_files(fs: StoreFS, found: Scanned, rel: str) -> dict[str, os.stat_result]:
    """The files ``ID.json`` of folder ``rel``, by id."""
    out = {}
    for name, st in _entries(fs, found, rel):
        cid = name.removesuffix(".json")
        if cid != name and not CID.fullmatch(cid):
            continue  # not a name the store gives: left alone
        if _file(found, f"{rel}/{name}", st, ".json"):
            out[cid] = st
    return out


def _read(fs: StoreFS, rel: str) -> dict:
    """A pins file or manifest as a dict; StoreFileError when it is not one."""
    try:
        data = load_json(fs.read(rel, MAX_JSON), rel)
    except NotAStoreFile as e:
        raise StoreFileError(str(e)) from e
    if not isinstance(data, dict):
        raise StoreFileError(f"{rel}: {type(data).__name__}, not an object")
    return data


def _pins(fs: StoreFS, cid: str) -> tuple[str, ...]:
    rel = f"pins/{cid}.json"
    keys = _read(fs, rel).get("keys")
    if not isinstance(keys, list) or not all(map(is_key, keys)):
        raise StoreFileError(f"{rel}: keys is not a list of page keys")
    return tuple(keys)


def _manifest(fs: StoreFS, cid: str, keys: tuple[str, ...]) -> Checkpoint:
    rel = f"checkpoints/{cid}.json"
    man = _read(fs, rel)
    numbers = [man.get(f) for f in _MANIFEST]
    created = man.get("created")
    if not all(type(v) is int and v >= 0 for v in numbers):
        raise StoreFileError(f"{rel}: {', '.join(_MANIFEST)} are not counts")
    if type(created) not in (int, float) or not math.isfinite(created):
        raise StoreFileError(f"{rel}: created is not a time")
    return Checkpoint(cid, keys, *numbers, float(created))


def _checkpoints(fs: StoreFS, found: Scanned, now: float, orphan_age_s: float) -> None:
    manifests = _json_files(fs, found, "checkpoints")
    for cid, st in _json_files(fs, found, "pins").items():
        pins, held = f"pins/{cid}.json", manifests.pop(cid, None)
        man = f"checkpoints/{cid}.json"
        try:
            keys = _pins(fs, cid)
            cp = _manifest(fs, cid, keys) if held is not None else None
        except (StoreFileError, OSError) as e:  # the checkpoint's two files go together
            reason = "malformed" if isinstance(e, StoreFileError) else "unreadable"
            for rel in (pins, man) if held is not None else (pins,):
                found.set_aside(rel, reason, str(e) if rel in str(e) else f"with its pair: {e}")
            continue
        if cp is not None:
            found.meta[man] = allocated_bytes(held)
        elif now - st.st_mtime > orphan_age_s:
            found.reap("orphan_pin", pins, st)
            continue
        else:  # being written: its pins hold until it is done or old enough to be an orphan
            cp = Checkpoint(cid, keys, 0, 0, 0, st.st_mtime, complete=False)
        found.meta[pins] = allocated_bytes(st)
        found.checkpoints.append(cp)
    for cid, st in manifests.items():  # reaped once read as a manifest the store wrote
        rel = f"checkpoints/{cid}.json"
        try:
            _manifest(fs, cid, ())
        except StoreFileError as e:
            found.set_aside(rel, "malformed", str(e))
            continue
        except OSError as e:
            found.set_aside(rel, "unreadable", f"{type(e).__name__}: {e}")
            continue
        found.reap("orphan_manifest", rel, st)


def scan_store(fs: StoreFS, identity: str, now: float, orphan_age_s: float) -> Scanned:
    """Everything under the store's root it owns, sorted into kept, reaped and set aside."""
    t0 = time.perf_counter()
    found = Scanned()
    _pages(fs, found, identity)
    _checkpoints(fs, found, now, orphan_age_s)
    found.seconds = time.perf_counter() - t0
    return found
