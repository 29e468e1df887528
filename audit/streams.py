"""How a log is opened: a file, a gzip stream (by its first two bytes), or a stream that cannot
seek: a pipe, a FIFO, a process substitution, or the standard input, named ``-``
(``docker logs -t x 2>&1 | audit verdict -``).

A stream is read once: its first bytes, read to tell gzip from text, are handed back before the
rest. A command that reads its logs twice (``audit report``, ``audit diff``) copies each stream
to a temporary file first (``spooled``: the bytes as they came, gzip or not, under the stream's
own name, gone when the command is done) and reads that. A second opening of the same stream
would read it empty and judge nothing as if it were the log: it is refused instead
(``UnreadableLog``, sysexits 66), with what to do.
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STDIN = "-"  # a log named so is the standard input
_OPENED: set[tuple[int, int]] = set()  # (device, inode) of the streams opened in this process


class UnreadableLog(Exception):
    """A log that cannot be opened or decoded at all (sysexits 66)."""


def is_file(path: str | Path) -> bool:
    """Whether ``path`` names a regular file (one that can be read again, and from anywhere)."""
    return str(path) != STDIN and Path(path).is_file()


def display_name(path: Path) -> str:
    """The name a log's lines are placed by (``name:line``)."""
    return "stdin" if str(path) == STDIN else path.name


def open_log(path: Path) -> Any:
    """``path`` opened for ``read1``: gunzipped where it starts as gzip does."""
    try:
        fh = _raw(path)
        magic = fh.read(2)  # as many as come: a stream may end sooner
        if fh.seekable():
            fh.seek(0)
        else:
            fh = _Replayed(magic, fh)
    except OSError as e:
        raise UnreadableLog(f"{path}: {e.strerror or e}") from e
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh, mode="rb")
    return fh


def _raw(path: Path) -> Any:
    """``path``'s bytes as they come (a stream's once: ``_once``; stdin not a terminal)."""
    stdin = str(path) == STDIN
    if stdin and os.isatty(0):
        raise UnreadableLog("-: the standard input is a terminal: pipe a log in")
    st = os.fstat(0) if stdin else os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        _once(path, (st.st_dev, st.st_ino))  # before opening: a FIFO's open waits for a writer
    return os.fdopen(os.dup(0), "rb") if stdin else path.open("rb")


def _is_stream(path: str) -> bool:
    """The standard input, or a name that is neither a regular file nor a folder (one missing is
    left for the reader to refuse)."""
    if path == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextmanager
def spooled(paths: list[str]) -> Iterator[list[str]]:
    """``paths``, each stream among them copied to a temporary file (named as the stream is, so
    its lines are placed by the same name) for a command that reads its logs twice; the copies
    are removed when the command is done. A stream that cannot be read is ``UnreadableLog``."""
    streams = [_is_stream(p) for p in paths]
    if not any(streams):
        yield paths
        return
    with tempfile.TemporaryDirectory(prefix="audit-spool-") as tmp:
        out = []
        for i, (p, stream) in enumerate(zip(paths, streams)):
            if not stream:
                out.append(p)
                continue
            copy = Path(tmp, str(i), display_name(Path(p)))
            copy.parent.mkdir()
            try:
                with _raw(Path(p)) as src, copy.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except OSError as e:
                raise UnreadableLog(f"{p}: {e.strerror or e}") from e
            out.append(str(copy))
        yield out


def _once(path: Path, key: tuple[int, int]) -> None:
    """Refuses a stream this process opened already."""
    if key in _OPENED:
        what = "the standard input" if str(path) == STDIN else "a stream (a pipe or a FIFO)"
        raise UnreadableLog(
            f"{path}: {what} reads once, and this command reads its logs twice: save the stream "
            "to a file and name the file"
        )
    _OPENED.add(key)


class _Replayed:
    """A stream that cannot seek, with the bytes already read from it handed back first."""

    def __init__(self, first: bytes, fh: Any) -> None:
        self.first, self.fh = first, fh

    def read1(self, n: int = -1) -> bytes:
        if not self.first:
            return self.fh.read1(n)
        k = len(self.first) if n is None or n < 0 else n
        out, self.first = self.first[:k], self.first[k:]
        return out

    def read(self, n: int = -1) -> bytes:
        if not self.first:
            return self.fh.read(n)
        if n is None or n < 0:
            out, self.first = self.first + self.fh.read(), b""
            return out
        out, self.first = self.first[:n], self.first[n:]
        return out if len(out) == n else out + self.fh.read(n - len(out))

    def close(self) -> None:
        self.fh.close()

    def __enter__(self) -> _Replayed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
