"""Acceptance specs: ``audit/acceptance/<window>/spec.toml`` (package data, so an installed
wheel has them too), found by window name or path, read, and parsed (by ``audit.parse``) into the
model of ``audit.model``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from audit.model import Spec
from audit.parse import SpecError, parse_spec


def load_spec(path: str | Path) -> Spec:
    p = Path(path)
    if p.is_dir():
        p = p / "spec.toml"
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: cannot read spec: {e}") from None
    return parse_spec(text, p)


def acceptance_dir() -> Path:
    """Where the shipped windows live: $ATTEST_ACCEPTANCE, else ``acceptance/`` in this package
    (its package data: the same folder in a checkout and in an installed wheel)."""
    env = os.environ.get("ATTEST_ACCEPTANCE")
    return Path(env) if env else Path(__file__).resolve().parent / "acceptance"


def shipped() -> list[Path]:
    root = acceptance_dir()
    return sorted(p.parent for p in root.glob("*/spec.toml"))


def resolve(name_or_path: str) -> Spec:
    """A shipped window by name, or a spec file or window folder by path."""
    p = Path(name_or_path)
    if p.exists():
        return load_spec(p)
    if re.fullmatch(r"[A-Za-z0-9_-]+", name_or_path):
        window = acceptance_dir() / name_or_path
        if (window / "spec.toml").exists():
            return load_spec(window)
    known = ", ".join(w.name for w in shipped()) or "none"
    raise SpecError(f"no spec {name_or_path!r}: not a file, and not a shipped window ({known})")
