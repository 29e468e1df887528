"""The logs a command was given, as the files to read: a file as named, a glob pattern (quoted,
so the auditor expands it, the same on every shell) and a directory (the logs in it), each
expanded in sorted order. Rank logs arrive this way: one file per rank of a boot, in a folder or
under one pattern.

A pattern or a directory that names no log is a usage error (``NoLogs``, sysexits 64): auditing
nothing must never look like auditing something. A plain name that does not exist is passed on
as it is, for the reader to refuse (``UnreadableLog``, 66). A file named twice (by name, a
pattern or a directory) is read once.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from pathlib import Path

# what a directory's logs are called: boot logs, their gzipped copies, captured stderr
LOG_SUFFIXES = (".jsonl", ".log", ".gz")


class NoLogs(ValueError):
    """A pattern or a directory that names no log (sysexits 64)."""


def is_log_name(name: str) -> bool:
    return not name.startswith(".") and name.endswith(LOG_SUFFIXES)


def _in_dir(d: Path) -> list[str]:
    found = sorted(str(p) for p in d.iterdir() if is_log_name(p.name) and p.is_file())
    if not found:
        shown = ", ".join(f"*{s}" for s in LOG_SUFFIXES)
        raise NoLogs(f"directory {str(d)!r} holds no log ({shown})")
    return found


def _matches(pattern: str) -> list[str]:
    found = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not found:
        raise NoLogs(f"pattern {pattern!r} matches no file")
    return found


def expand_logs(args: Iterable[str]) -> list[str]:
    """The files to read, in order: each argument as a file, a directory or a pattern."""
    out: list[str] = []
    seen: set[str] = set()
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            found = _in_dir(p)
        elif not p.exists() and any(c in arg for c in "*?["):
            found = _matches(arg)
        else:
            found = [arg]  # a file, or a name the reader will refuse (66)
        for f in found:
            key = os.path.realpath(f)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out
