"""The reader's common case compiled (``audit/fastscan.c``): built once per source and Python,
loaded where it was built, and the reader's own loop where it was not.

    python -m audit.native [build | status]

The C loop takes a run of plain receipts of one (boot, rank) whose seqs follow one another, the
bulk of a receipt log, and hands any other line back to the reader's loop in Python, which
decides everything else; both give the same counts, the same records in the same order and the
same errors (``tests/unit/test_audit_native.py`` reads logs both ways). The follow-up windows'
receiver (``audit/fastfollow.c``, the same rule as ``audit.followups``') and the wedge
detector's common steps (``audit/fastwedge.c``, ``audit.wedge``'s) are built into it.
``ATTEST_AUDIT_NATIVE=0`` turns them all off. Building needs a C compiler (``cc``) and Python's
headers; without them the auditor reads as before, only slower.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

NAME = "attest_fastscan"  # the module name the C file initializes (PyInit_attest_fastscan)
SOURCE = Path(__file__).with_name("fastscan.c")  # the module's own; the others built into it:
# the follow-up windows' receiver (``fast_follower``), the wedge detector's (``fast_feeder``)
WITH = ("fastfollow.c", "fastwedge.c")
ROOT = Path(__file__).resolve().parents[1] / "build" / "audit"
CFLAGS = ("-O2", "-shared", "-fPIC", "-Wall")


def library_path() -> Path:
    key = hashlib.sha256()
    sources = [p.read_bytes() for p in _sources()]
    for part in (*sources, sys.version.encode(), " ".join(CFLAGS).encode()):
        key.update(part + b"\0")
    return ROOT / key.hexdigest()[:16] / f"{NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"


def _sources() -> list[Path]:
    return [SOURCE, *(SOURCE.with_name(name) for name in WITH)]


def _missing() -> Path | None:
    return next((p for p in _sources() if not p.is_file()), None)


@cache
def fast_run() -> Callable[..., Any] | None:
    """The compiled loop's ``run``, or None (off, not built for this source and Python, or it
    did not load: ``why_not``)."""
    return None if why_not() else _loaded().run


@cache
def fast_follower() -> Callable[..., Any] | None:
    """The compiled ``follower`` (``audit/fastfollow.c``: a follow-up receiver, the same rule as
    ``audit.followups``'), or None where the compiled loop is not at hand (``why_not``)."""
    return None if why_not() else _loaded().follower


@cache
def fast_feeder() -> Callable[..., Any] | None:
    """The compiled ``feeder`` (``audit/fastwedge.c``: the wedge detector's common steps, every
    other receipt handed to ``audit.wedge``'s own rule), or None where it is not at hand."""
    return None if why_not() else _loaded().feeder


@cache
def _loaded() -> ModuleType:
    path = library_path()
    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a loadable module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def why_not() -> str | None:
    if os.environ.get("ATTEST_AUDIT_NATIVE", "").strip() == "0":
        return "turned off (ATTEST_AUDIT_NATIVE=0)"
    if (gone := _missing()) is not None:  # an installed package ships no C source
        return f"its source {gone.name} is not here"
    path = library_path()
    if not path.exists():
        return f"not built for this source and Python ({path.parent.name}): run `make`"
    try:
        _loaded()
    except (ImportError, OSError) as e:
        return f"did not load: {e}"
    return None


def build() -> Path:
    """Compile into ``library_path()`` (a no-op when it is there). Raises what the compiler
    said when it fails (OSError where there is no source or no compiler)."""
    if (gone := _missing()) is not None:
        raise FileNotFoundError(f"its source {gone} is not here")
    path = library_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    include = sysconfig.get_paths()["include"]
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    cmd = [cc, *CFLAGS, f"-I{include}", *map(str, _sources()), "-o", str(tmp)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()[-2000:]}")
    tmp.replace(path)  # whole or not at all: a reader never loads half a file
    return path


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "status"
    if cmd == "build":
        try:
            path = build()
        except (OSError, RuntimeError) as e:
            print(
                f"the auditor's native reader not built ({e}); it reads in Python", file=sys.stderr
            )
            return 0
        print(f"the auditor's native reader: {path}")
        return 0
    if cmd == "status":
        print(f"the auditor's native reader: {why_not() or library_path()}")
        return 0
    print("usage: python -m audit.native [build | status]", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
