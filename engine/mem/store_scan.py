"""Reading a durable KV store's directory back at boot: which page files are whole pages of this
model, which checkpoints exist and what they pin, and what is to be reaped (and why).

Reads headers only (a page's payload is checked against its checksum when it is loaded), so a
scan costs one small read per file. Reasons a file is reaped: ``partial`` (a temporary file a
crash left), ``corrupt`` (a page whose header or length is wrong), ``foreign`` (a page another
model wrote), ``orphan_pin`` (a pins file whose checkpoint never got its manifest, older than
the orphan age), ``orphan_manifest`` (a manifest whose pins are gone).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from engine.mem.store_files import (
    PAGE_EXT,
    TMP,
    PageHeader,
    StoreFileError,
    allocated_bytes,
    read_header,
)

Reaped = list[tuple[Path, int, int]]  # path, allocated bytes, apparent bytes


class Checkpoint(NamedTuple):
    id: str
    keys: tuple[str, ...]
    tokens: int
    pinned_bytes: int  # pinned by this checkpoint alone when it was made
    shared_bytes: int  # already pinned by another when it was made
    created: float
    complete: bool = True  # False: its pins are written, its manifest not yet


@dataclass(slots=True)
class Scanned:
    files: int = 0
    apparent: int = 0
    pages: list[tuple[str, PageHeader, os.stat_result, float]] = field(default_factory=list)
    meta: dict[Path, int] = field(default_factory=dict)  # checkpoint files kept: allocated bytes
    checkpoints: list[Checkpoint] = field(default_factory=list)
    reaped: dict[str, Reaped] = field(default_factory=dict)
    seconds: float = 0.0

    def reap(self, reason: str, path: Path, st: os.stat_result) -> None:
        self.reaped.setdefault(reason, []).append((path, allocated_bytes(st), st.st_size))


def _files(top: Path) -> list[tuple[Path, os.stat_result]]:
    out = []
    for dirpath, _, names in os.walk(top):
        for name in names:
            path = Path(dirpath) / name
            try:
                out.append((path, os.stat(path)))
            except OSError:  # gone since the walk listed it
                continue
    return out


def _page(found: Scanned, path: Path, st: os.stat_result, identity: str) -> None:
    if path.name.endswith(TMP):
        found.reap("partial", path, st)
        return
    if not path.name.endswith(PAGE_EXT):
        return  # not the store's: left alone, not counted
    try:
        header = read_header(path)
    except (OSError, StoreFileError):
        found.reap("corrupt", path, st)
        return
    if header.identity != identity:
        found.reap("foreign", path, st)
    elif header.key != path.name[: -len(PAGE_EXT)]:
        found.reap("corrupt", path, st)
    else:
        found.pages.append((header.key, header, st, st.st_mtime))


def _load_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _checkpoints(root: Path, found: Scanned, now: float, orphan_age_s: float) -> None:
    pins_dir, man_dir = root / "pins", root / "checkpoints"
    manifests = {p.stem: (p, st) for p, st in _files(man_dir) if p.suffix == ".json"}
    for path, st in _files(pins_dir):
        if path.name.endswith(TMP) or path.suffix != ".json":
            found.reap("partial", path, st)
            continue
        pins = _load_json(path)
        if pins is None or not isinstance(pins.get("keys"), list):
            found.reap("corrupt", path, st)
            continue
        held = manifests.pop(path.stem, None)
        man = None if held is None else _load_json(held[0])
        keys = tuple(str(k) for k in pins["keys"])
        if man is not None:
            cp = Checkpoint(path.stem, keys, int(man.get("tokens", 0)),
                            int(man.get("pinned_bytes", 0)), int(man.get("shared_bytes", 0)),
                            float(man.get("created", st.st_mtime)))  # fmt: skip
            found.meta[held[0]] = allocated_bytes(held[1])
        elif now - st.st_mtime > orphan_age_s:
            found.reap("orphan_pin", path, st)
            if held is not None:
                found.reap("corrupt", held[0], held[1])
            continue
        else:  # being written: its pins hold until it is done or old enough to be an orphan
            cp = Checkpoint(path.stem, keys, 0, 0, 0, st.st_mtime, complete=False)
        found.meta[path] = allocated_bytes(st)
        found.checkpoints.append(cp)
    for path, st in manifests.values():
        found.reap("orphan_manifest", path, st)


def scan_store(root: Path, identity: str, now: float, orphan_age_s: float) -> Scanned:
    """Everything under ``root`` the store owns, sorted into kept and reaped."""
    t0 = time.perf_counter()
    found = Scanned()
    for path, st in _files(root / "pages"):
        found.files += 1
        found.apparent += st.st_size
        _page(found, path, st, identity)
    _checkpoints(root, found, now, orphan_age_s)
    found.files += len(found.meta) + sum(
        1 for r in ("orphan_pin", "orphan_manifest") for _ in found.reaped.get(r, [])
    )
    found.seconds = time.perf_counter() - t0
    return found
