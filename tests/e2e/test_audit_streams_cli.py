"""A log piped into the auditor, as operators collect one (``docker logs x 2>&1 | audit verdict
-``): read once, judged as the same file is; a command that would read it twice refuses it."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from tests.e2e.audit_cli import case_log


def _audit(stdin: bytes, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.audit_app", *args], input=stdin, capture_output=True
    )


def _judged(out: bytes) -> dict:
    report = json.loads(out)
    report.pop("logs")
    return report


def test_a_log_piped_in_as_minus_is_judged_as_the_file_is(tmp_path: Path) -> None:
    log = case_log(tmp_path, "no_request_lost", "pass")
    data = Path(log).read_bytes()
    from_file = _audit(b"", "verdict", log, "--spec", "no_request_lost", "--json")
    piped = _audit(data, "verdict", "-", "--spec", "no_request_lost", "--json")
    assert piped.returncode == from_file.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["logs"] == ["-"]
    assert _judged(piped.stdout) == _judged(from_file.stdout)
    # gzipped on its way in (a rotated log through zcat-less pipes): read as the file is
    zipped = _audit(gzip.compress(data), "verdict", "-", "--spec", "no_request_lost", "--json")
    assert zipped.returncode == 0 and _judged(zipped.stdout) == _judged(from_file.stdout)


def test_a_command_that_reads_its_logs_twice_spools_a_stream_first(tmp_path: Path) -> None:
    """`audit diff` and `audit report` read each log for its verdicts and again for its numbers:
    a stream is copied to a temporary file first and read from there, as the file is."""
    log = case_log(tmp_path, "no_request_lost", "pass")
    data = Path(log).read_bytes()
    from_file = _audit(b"", "diff", log, log, "--json")
    piped = _audit(data, "diff", log, "-", "--json")
    assert piped.returncode == from_file.returncode == 0, piped.stderr
    a, b = json.loads(piped.stdout), json.loads(from_file.stdout)
    assert a["b"].pop("logs") == ["-"] and b["b"].pop("logs") == [log]
    assert a == b
    out = tmp_path / "r.html"
    wrote = _audit(gzip.compress(data), "report", "-", "-o", str(out))
    assert wrote.returncode == 0, wrote.stderr
    assert wrote.stdout.decode().startswith("wrote ") and out.stat().st_size > 0


def test_one_stream_named_twice_is_refused_with_66(tmp_path: Path) -> None:
    """Read once: the second naming would be empty, and its numbers those of nothing."""
    log = case_log(tmp_path, "no_request_lost", "pass")
    got = _audit(Path(log).read_bytes(), "diff", "-", "-")
    assert got.returncode == 66, got
    assert b"reads once" in got.stderr and b"save the stream to a file" in got.stderr
