"""The durable KV store's files: where they live, how one is written so that a crash leaves either
the whole file or none under its name, and how one is read back and checked.

A page file holds one page of KV (every layer's K and V) behind a small header that describes
it, so the store's index can be rebuilt from the files alone:

    MAGIC | header length (4 bytes, little-endian) | header (JSON) | payload

The header names the page's key, its parent's key (the page before it in the prefix; None for a
prompt's first page), its tokens, the identity of the model that wrote it, the payload's length
and its checksum (BLAKE2b). Files fan out in two levels of subdirectories by key, never one flat
directory. Everything is written to a temporary name in the same directory and renamed
(``store_fs.StoreFS.write_atomic``): a partial write is a ``*.tmp`` file that the next scan reaps.
A header is checked field by field (types, its key against its tokens, its length against the
file's): a file that fails is malformed, set aside by whoever read it, never fatal.

Bytes are charged as allocated, ``max(st_blocks * 512, st_size)``: what the filesystem actually
holds for the file, which for small files can be many times what they contain.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

MAGIC = b"ATTESTKV1\n"
PAGE_EXT = ".kv"
_LEN = struct.Struct("<I")
MAX_HEADER = 1 << 20  # a longer header is not one this store wrote
HEX32 = re.compile(r"[0-9a-f]{32}")  # a key or a checksum


class StoreFileError(Exception):
    """A file that is not a complete, intact page of this store (the reason in words)."""


class ChecksumMismatch(StoreFileError):
    """A page whose payload is not the one its header's checksum names."""


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


def page_rel(key: str) -> str:
    """A page's file, relative to the store's root."""
    return f"pages/{key[:2]}/{key[2:4]}/{key}{PAGE_EXT}"


def page_path(root: Path, key: str) -> Path:
    return root / page_rel(key)


def encode_page(header: PageHeader, payload: bytes | memoryview) -> list[bytes | memoryview]:
    head = json.dumps(header._asdict(), separators=(",", ":")).encode()
    return [MAGIC, _LEN.pack(len(head)), head, payload]


def load_json(raw: bytes, what: str) -> Any:
    """JSON the store wrote; StoreFileError for anything that does not parse (deep nesting
    included: the parser's recursion limit is an answer here, not a crash)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise StoreFileError(f"{what}: unreadable JSON ({type(e).__name__})") from e


def is_key(v: object) -> bool:
    return isinstance(v, str) and HEX32.fullmatch(v) is not None


def _is_count(v: object) -> bool:
    return type(v) is int and v >= 0


def check_header(data: object, where: str) -> PageHeader:
    """The header a page's JSON describes, every field of the type the store writes and its
    key the key of its tokens; StoreFileError naming what is wrong."""
    if not isinstance(data, dict) or sorted(data) != sorted(PageHeader._fields):
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise StoreFileError(f"{where}: a header of {got}, not {list(PageHeader._fields)}")
    h = PageHeader(**data)
    tokens_ok = isinstance(h.tokens, list) and all(
        type(t) is int and -(2**63) <= t < 2**63 for t in h.tokens
    )
    for ok, field in (
        (is_key(h.key), "key"),
        (h.parent is None or is_key(h.parent), "parent"),
        (tokens_ok and len(h.tokens) > 0, "tokens"),
        (isinstance(h.identity, str), "identity"),
        (_is_count(h.payload), "payload"),
        (is_key(h.checksum), "checksum"),
    ):
        if not ok:
            raise StoreFileError(f"{where}: header field {field} is not what the store writes")
    if page_key(h.parent, h.tokens, h.identity) != h.key:
        raise StoreFileError(f"{where}: its key is not the key of its {len(h.tokens)} tokens")
    return h


def read_header(fh: BinaryIO, size: int, where: str) -> PageHeader:
    """The header of the page file open in ``fh`` (``size`` bytes long), checked against the
    file's length (a partial file fails); raises StoreFileError or OSError."""
    if fh.read(len(MAGIC)) != MAGIC:
        raise StoreFileError(f"{where}: not a page of this store (no magic)")
    raw = fh.read(_LEN.size)
    if len(raw) != _LEN.size:
        raise StoreFileError(f"{where}: cut short in its header")
    (n,) = _LEN.unpack(raw)
    if n > MAX_HEADER:
        raise StoreFileError(f"{where}: a header of {n} bytes")
    header = check_header(load_json(fh.read(n), where), where)
    body = size - len(MAGIC) - _LEN.size - n
    if body != header.payload:
        raise StoreFileError(f"{where}: payload of {body} bytes, header says {header.payload}")
    return header


def read_payload(fh: BinaryIO, header: PageHeader, where: str) -> bytes:
    """The payload after ``read_header``, checked against its checksum; StoreFileError."""
    payload = fh.read(header.payload)
    if checksum(payload) != header.checksum:
        raise ChecksumMismatch(f"{where}: checksum mismatch")
    return payload


_READERS: list[ThreadPoolExecutor] = []


def page_readers() -> ThreadPoolExecutor:
    """The threads that read pages (file reads and hashing let go of the GIL)."""
    if not _READERS:
        _READERS.append(ThreadPoolExecutor(max_workers=8, thread_name_prefix="attest-kv-read"))
    return _READERS[0]
