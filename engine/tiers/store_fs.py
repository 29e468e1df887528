"""The durable KV store's directory, touched only through here, so that nothing outside it is
read, written or removed whatever someone else put in it.

* **No link is followed below the root.** A path is walked from the root one folder at a time,
  each opened with ``O_NOFOLLOW``; names are created, renamed and removed through the
  descriptor of their folder. The root itself is the operator's (``--kv-store-dir``), taken as
  given.
* **Only regular files of one link are opened**, with ``O_NONBLOCK`` and checked with ``fstat``
  before a byte is read: a FIFO, socket or device is never waited on, and a file hard-linked
  from elsewhere (the store's own files have one link: it writes by rename) is never read.
* **Writes are atomic**: a temporary name in the same folder (``*.tmp``), then a rename; with
  ``sync`` the file and its folder are flushed with ``fsync``.
* **What the store will not use is set aside**, moved (never deleted) into ``quarantine/``
  under the root: never read, never counted, never removed by the store; the operator's.

Paths are relative to the root, ``/``-separated (``pages/ab/cd/KEY.kv``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

TMP = ".tmp"
QUARANTINE = "quarantine"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotAStoreFile(OSError):
    """A name that holds something other than a regular file of one link (the reason in words)."""


def what(st: os.stat_result) -> str:
    """What an entry is, in words."""
    m = st.st_mode
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(m):
            return name
    if stat.S_ISREG(m):
        return "a file" if st.st_nlink == 1 else f"a file of {st.st_nlink} hard links"
    return "something unknown"


def is_store_file(st: os.stat_result) -> bool:
    """A regular file of one link: the only kind of file the store writes."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _split(rel: str) -> tuple[str, str]:
    head, _, name = rel.rpartition("/")
    return head, name


class StoreFS:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @contextmanager
    def folder(self, rel: str, make: bool = False) -> Iterator[int]:
        """A descriptor of the folder ``rel`` (``""``: the root), reached without following a
        link; ``make``: its missing folders are made. Raises OSError (a link is ``ELOOP``)."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in filter(None, rel.split("/")):
                if make:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                nxt = os.open(part, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def entries(self, rel: str) -> list[tuple[str, os.stat_result]]:
        """The names in folder ``rel`` and what each is (``lstat``: a link is a link); empty
        when the folder is missing. Raises OSError when ``rel`` is not a folder reached
        without a link."""
        try:
            with self.folder(rel) as fd:
                return entries_at(fd)
        except FileNotFoundError:
            return []

    def lstat(self, rel: str) -> os.stat_result:
        head, name = _split(rel)
        with self.folder(head) as fd:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)

    @contextmanager
    def open(self, rel: str) -> Iterator[tuple[BinaryIO, os.stat_result]]:
        """The regular file ``rel`` open for reading, with its ``fstat``; raises NotAStoreFile
        for anything else (never opened), OSError when it cannot be opened."""
        head, name = _split(rel)
        with self.folder(head) as d, open_at(d, name, rel) as got:
            yield got

    def read(self, rel: str, limit: int) -> bytes:
        """The whole of the regular file ``rel``; NotAStoreFile past ``limit`` bytes."""
        with self.open(rel) as (fh, st):
            if st.st_size > limit:
                raise NotAStoreFile(f"{rel} is {st.st_size} bytes, over {limit}")
            return fh.read(limit + 1)

    def write_atomic(
        self, rel: str, data: bytes | list[bytes | memoryview], sync: bool = False
    ) -> os.stat_result:
        """Write ``data`` to ``rel`` through a temporary name in its folder and a rename, so the
        name holds the whole file or the one before it (a process killed mid-write leaves a
        ``*.tmp`` file). ``sync``: the file and then its folder and those above it (one may
        have been made for it) are flushed to the disk, so it also outlives a power loss.
        Returns the file's ``lstat``. Raises OSError (the temporary file is removed)."""
        head, name = _split(rel)
        tmp = f"{name}.{os.getpid()}{TMP}"
        with self.folder(head, make=True) as d:
            try:
                fd = os.open(tmp, _CREATE, 0o644, dir_fd=d)
            except FileExistsError:  # a leftover of an earlier process of this pid
                os.unlink(tmp, dir_fd=d)
                fd = os.open(tmp, _CREATE, 0o644, dir_fd=d)
            try:
                with os.fdopen(fd, "wb") as fh:
                    for part in [data] if isinstance(data, bytes) else data:
                        fh.write(part)
                    if sync:
                        fh.flush()
                        os.fsync(fh.fileno())
                os.replace(tmp, name, src_dir_fd=d, dst_dir_fd=d)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=d)
                except OSError:
                    pass
                raise
            st = os.stat(name, dir_fd=d, follow_symlinks=False)
        if sync:
            self.sync_folders([head])
        return st

    def unlink(self, rel: str) -> None:
        """Remove the name ``rel`` (a link itself, never what it points to); gone already is
        fine. Raises OSError."""
        head, name = _split(rel)
        try:
            with self.folder(head) as d:
                os.unlink(name, dir_fd=d)
        except FileNotFoundError:
            pass

    def set_aside(self, rel: str) -> str:
        """Move ``rel`` (whatever it is: a link is moved, not followed) into ``quarantine/``,
        under its path with ``/`` as ``~``; returns where it went. Raises OSError."""
        head, name = _split(rel)
        flat = rel.replace("/", "~")[-200:]
        with self.folder(QUARANTINE, make=True) as q, self.folder(head) as d:
            target, n = flat, 0
            while _exists(target, q):
                n += 1
                target = f"{flat}.{n}"
            os.rename(name, target, src_dir_fd=d, dst_dir_fd=q)
        return f"{QUARANTINE}/{target}"

    def sync(self, files: Iterable[str]) -> None:
        """Flush ``files`` to the disk, then every folder that holds them and the folders above
        those up to the root (a file's name is durable once its folder is). Raises OSError."""
        heads = []
        for rel in files:
            with self.open(rel) as (fh, _):
                os.fsync(fh.fileno())
            heads.append(_split(rel)[0])
        self.sync_folders(heads)

    def sync_folders(self, rels: Iterable[str]) -> None:
        """Flush the folders ``rels`` and every folder above them up to the root, deepest
        first, each once. Raises OSError."""
        folders: set[str] = {""}
        for head in rels:
            while head:
                folders.add(head)
                head = _split(head)[0]
        for rel in sorted(folders, key=len, reverse=True):
            with self.folder(rel) as d:
                os.fsync(d)


def entries_at(d: int) -> list[tuple[str, os.stat_result]]:
    """The names in the folder ``d`` and what each is (``lstat``)."""
    out = []
    for name in os.listdir(d):
        try:
            out.append((name, os.stat(name, dir_fd=d, follow_symlinks=False)))
        except FileNotFoundError:  # gone since it was listed
            continue
    return out


@contextmanager
def open_at(d: int, name: str, rel: str) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """``name`` in the folder ``d`` open for reading, when it is a regular file of one link:
    checked before it is opened (a device is never opened, a FIFO never waited on) and again
    after (it may have been swapped meanwhile). ``rel`` names it in errors."""
    before = os.stat(name, dir_fd=d, follow_symlinks=False)
    if not is_store_file(before):
        raise NotAStoreFile(f"{rel} is {what(before)}")
    fd = os.open(name, _READ, dir_fd=d)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not is_store_file(st) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise NotAStoreFile(f"{rel} is {what(st)}, swapped while it was opened")
        yield fh, st


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
