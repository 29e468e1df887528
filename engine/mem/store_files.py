"""The durable KV store's files: where they live, how one is written so that a crash leaves either
the whole file or none under its name, and how one is read back and checked.

A page file holds one page of KV (every layer's K and V) behind a small header that describes
it, so the store's index can be rebuilt from the files alone:

    MAGIC | header length (4 bytes, little-endian) | header (JSON) | payload

The header names the page's key, its parent's key (the page before it in the prefix; None for a
prompt's first page), its tokens, the identity of the model that wrote it, the payload's length
and its checksum (BLAKE2b). Files fan out in two levels of subdirectories by key, never one flat
directory. Everything is written to a temporary name in the same directory, flushed, and renamed:
a partial write is a ``*.tmp`` file that the next scan reaps.

Bytes are charged as allocated, ``max(st_blocks * 512, st_size)``: what the filesystem actually
holds for the file, which for small files can be many times what they contain.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

MAGIC = b"ATTESTKV1\n"
TMP = ".tmp"
PAGE_EXT = ".kv"
_LEN = struct.Struct("<I")
MAX_HEADER = 1 << 20  # a longer header is not one this store wrote


class StoreFileError(Exception):
    """A file that is not a complete, intact page of this store (the reason in words)."""


class PageHeader(NamedTuple):
    key: str
    parent: str | None
    tokens: list[int]
    identity: str
    payload: int
    checksum: str


def allocated_bytes(st: os.stat_result) -> int:
    """What a file costs on its filesystem: its allocated blocks, never less than its size."""
    return max(st.st_blocks * 512, st.st_size)


def checksum(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def page_key(parent: str | None, tokens: list[int], identity: str) -> str:
    """A page's key: its tokens chained to the key of the page before it (so a key names the whole
    prefix up to its page's end) and, for a first page, to the model's identity."""
    h = hashlib.blake2b(digest_size=16)
    h.update((parent or identity).encode())
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return h.hexdigest()


def page_path(root: Path, key: str) -> Path:
    return root / "pages" / key[:2] / key[2:4] / (key + PAGE_EXT)


def write_atomic(path: Path, data: bytes | list[bytes | memoryview], sync: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary name in the same directory and a rename, so
    the name holds the whole file or the one before it (a process killed mid-write leaves a
    ``*.tmp`` file). ``sync``: flushed to the disk before the rename, so it also outlives a power
    loss (a page without it that a power loss tears fails its checksum and is reaped). Raises
    OSError (the temporary file is removed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}{TMP}")
    try:
        with open(tmp, "wb") as fh:
            for part in [data] if isinstance(data, bytes) else data:
                fh.write(part)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def encode_page(header: PageHeader, payload: bytes | memoryview) -> list[bytes | memoryview]:
    head = json.dumps(header._asdict(), separators=(",", ":")).encode()
    return [MAGIC, _LEN.pack(len(head)), head, payload]


def _header(fh: Any, size: int, where: Path) -> PageHeader:
    if fh.read(len(MAGIC)) != MAGIC:
        raise StoreFileError(f"{where.name}: not a page of this store (no magic)")
    raw = fh.read(_LEN.size)
    if len(raw) != _LEN.size:
        raise StoreFileError(f"{where.name}: cut short in its header")
    (n,) = _LEN.unpack(raw)
    if n > MAX_HEADER:
        raise StoreFileError(f"{where.name}: a header of {n} bytes")
    try:
        header = PageHeader(**json.loads(fh.read(n)))
    except (ValueError, TypeError) as e:
        raise StoreFileError(f"{where.name}: unreadable header ({e})") from e
    body = size - len(MAGIC) - _LEN.size - n
    if body != header.payload:
        raise StoreFileError(f"{where.name}: payload of {body} bytes, header says {header.payload}")
    return header


def read_header(path: Path) -> PageHeader:
    """The header of a page file, checked against the file's length (a partial file fails);
    raises StoreFileError or OSError."""
    with open(path, "rb") as fh:
        return _header(fh, os.fstat(fh.fileno()).st_size, path)


def read_page(path: Path) -> tuple[PageHeader, bytes]:
    """A page file's header and payload, the payload checked against its checksum; raises
    StoreFileError or OSError."""
    with open(path, "rb") as fh:
        header = _header(fh, os.fstat(fh.fileno()).st_size, path)
        payload = fh.read(header.payload)
    if checksum(payload) != header.checksum:
        raise StoreFileError(f"{path.name}: checksum mismatch")
    return header, payload


_READERS: list[ThreadPoolExecutor] = []


def page_readers() -> ThreadPoolExecutor:
    """The threads that read pages (file reads and hashing let go of the GIL)."""
    if not _READERS:
        _READERS.append(ThreadPoolExecutor(max_workers=8, thread_name_prefix="attest-kv-read"))
    return _READERS[0]
