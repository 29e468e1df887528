"""The `audit` command's exit codes follow sysexits: a usage error is 64, never click's 2."""

from __future__ import annotations

import subprocess
import sys


def audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.audit_app", *args], capture_output=True, text=True
    )


def test_an_unknown_command_is_a_usage_error_64_naming_it():
    r = audit("frobnicate")
    assert r.returncode == 64, (r.returncode, r.stderr)
    assert "No such command 'frobnicate'" in r.stderr


def test_an_unknown_option_is_a_usage_error_64():
    r = audit("version", "--bogus")
    assert r.returncode == 64
    assert "--bogus" in r.stderr


def test_version_and_help_exit_0():
    assert audit("version").returncode == 0
    assert audit("--help").returncode == 0
