"""The layering holds: import-linter's contracts in pyproject.toml (layers cli -> measure ->
audit/engine -> kernels, the engine's rooms in their order, no import circle in any package, the
auditor, the frontend and a request's shapes without torch), the engine's top level holds only
its public API and its rooms, no function grows past what one reader holds in mind, and every
test file the product's code cites exists."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.product import ROOT, source_files


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


# The public API (``LLM``, ``SamplingParams``, ``EngineConfig``, ``RequestOutput``) and the rooms.
# A new room is a decision for docs/ARCHITECTURE.md's map and the "rooms" contract, made there
# first; a new loose file belongs in a room.
ENGINE_TOP = {
    "__init__.py",
    "llm.py",
    "config",
    "core",
    "group",
    "guided",
    "memory",
    "model",
    "observability",
    "request",
    "scheduler",
    "server",
    "speculative",
    "tiers",
}


def test_the_engine_top_level_is_its_public_api_and_its_rooms():
    top = {p.name for p in (ROOT / "engine").iterdir() if p.name != "__pycache__"}
    assert top == ENGINE_TOP, f"new: {sorted(top - ENGINE_TOP)}, gone: {sorted(ENGINE_TOP - top)}"


def long_functions(sources: dict[str, str], limit: int = 100) -> dict[str, int]:
    """Functions (and methods) of ``sources`` longer than ``limit`` lines, docstring included."""
    out = {}
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out[f"{path}:{node.lineno} {node.name}"] = lines
    return out


def test_no_function_over_100_lines():
    # Counted as the formatter lays the code out (nothing packed to pass): a function past a
    # hundred lines holds two steps that want names of their own.
    assert long_functions(source_files()) == {}


def test_the_function_check_counts_a_long_one():
    body = "\n".join(f"    x{i} = {i}" for i in range(100))
    assert long_functions({"m.py": f"def f():\n{body}\n"}) == {"m.py:1 f": 101}
    assert long_functions({"m.py": f"def f():\n{body[:-12]}\n"}) == {}


# Where the formatter would wreck a table, it is told to leave it: each place here, and only here.
# Everywhere else the formatter decides.
TABLES_KEPT = {
    "engine/server/protocol.py": 1,  # _UNBUILT: a field, its test and its message, a row each
    "engine/observability/metrics.py": 2,  # the latency and the token-count buckets
    "engine/observability/schema.py": 1,  # the receipt catalog, a kind a row
    "audit/report_series.py": 1,  # CARRIERS: a receipt kind and the series it carries
}


def test_the_formatter_is_told_to_skip_tables_only():
    marks = {}
    for path, text in source_files().items():
        for line in text.splitlines():
            if "# fmt: skip" in line or "# fmt: off" in line:
                assert line.lstrip()[:1] in ")]}", f"{path}: not a table's end: {line.strip()}"
                marks[path] = marks.get(path, 0) + 1
    assert marks == TABLES_KEPT


def test_every_test_file_the_product_cites_exists():
    """A module that sends its reader to a test (``tests/unit/...py`` pins this) sends them to
    one that is there: a renamed or merged test file takes its citations with it."""
    cited = {
        (path, m.group(0))
        for path, text in source_files().items()
        for m in re.finditer(r"tests/[\w/]+\.py", text)
    }
    missing = sorted((path, t) for path, t in cited if not (ROOT / t).is_file())
    assert not missing, missing
