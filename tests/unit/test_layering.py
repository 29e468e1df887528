"""The layering holds: import-linter's contracts in pyproject.toml (layers cli -> audit/engine ->
kernels, no import circle in any package, the auditor and the frontend without torch), and no
module grows past what one reader holds in mind."""

from __future__ import annotations

import ast
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
        [lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def product_files() -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): p.read_text()
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
    }


def test_no_module_over_400_lines():
    # A size pin on source text, on purpose: the split along the design's seams is the thing
    # kept here, and a module that outgrows one reader is what the split was for. The rooms
    # are by owner (memory.py is memory's, scheduler.py the step's), not by a count per file.
    sizes = {path: len(text.splitlines()) for path, text in product_files().items()}
    assert {p: n for p, n in sizes.items() if n > 400} == {}


def long_functions(sources: dict[str, str], limit: int = 60) -> dict[str, int]:
    """Functions (and methods) of ``sources`` longer than ``limit`` lines, docstring included."""
    out = {}
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out[f"{path}:{node.lineno} {node.name}"] = lines
    return out


def test_no_function_over_60_lines():
    assert long_functions(product_files()) == {}


def test_the_function_check_counts_a_long_one():
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    assert long_functions({"m.py": f"def f():\n{body}\n"}) == {"m.py:1 f": 61}
    assert long_functions({"m.py": f"def f():\n{body[:-12]}\n"}) == {}
