"""The `audit` command as an operator runs it, and the shipped self-test cases as log files."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

CASES = Path(__file__).resolve().parents[2] / "audit" / "acceptance"


def audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.audit_app", *args], capture_output=True, text=True
    )


def case_log(tmp_path: Path, window: str, case: str) -> str:
    """The log of ``window``'s self-test ``case``, written to a file."""
    t = tomllib.loads((CASES / window / "cases" / f"{case}.toml").read_text())
    p = tmp_path / f"{window}-{case}.log"
    p.write_text(t["log"])
    return str(p)
