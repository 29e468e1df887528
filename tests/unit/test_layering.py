"""The layering holds: import-linter's contracts in pyproject.toml (layers cli -> audit/engine ->
kernels, no import circle in any package, the auditor and the frontend without torch), and no
module grows past what one reader holds in mind."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "kernels", "audit", "cli")


def lint_imports() -> str:
    exe = Path(sys.executable).with_name("lint-imports")  # the dev extra installs it
    found = str(exe) if exe.exists() else shutil.which("lint-imports")
    assert found, "lint-imports not found: install the dev extra (import-linter)"
    return found


def test_import_contracts_are_kept():
    done = subprocess.run(
        [lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_module_over_400_lines_and_the_scheduler_within_350():
    # A size pin on source text, on purpose: the split along the design's seams is the thing
    # kept here, and a module that outgrows one reader is what the split was for.
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
    }
    assert {p: n for p, n in sizes.items() if n > 400} == {}
    assert sizes["engine/sched/scheduler.py"] <= 350
