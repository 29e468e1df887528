"""The product's source as the tests that read it see it (the layering, the typed seams, the
architecture's names): each file of the five packages, read once per test process."""

from __future__ import annotations

from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "kernels", "audit", "cli", "measure")


@cache
def source_files(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Path (from the repository's root) -> text, of every Python file under ``packages``."""
    return {
        str(p.relative_to(ROOT)): p.read_text()
        for pkg in packages
        for p in sorted((ROOT / pkg).rglob("*.py"))
    }
