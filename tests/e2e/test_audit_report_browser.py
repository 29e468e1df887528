"""The report in a real headless Chromium (Debian's, driven by playwright): the page loads with
no console error and no page error, asks the network for nothing, every plotly figure draws its
SVG with its traces, and a screenshot is taken.

`make test` installs Chromium where apt-get runs as root; where Chromium or playwright is still
missing the test skips and says why (pytest's summary lists the reason)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.browser import view, why_no_browser
from tests.unit.report_logs import FIGURES, busy_log


@pytest.fixture
def browser_ready():
    why = why_no_browser()
    if why:
        pytest.skip(why)


def test_the_report_renders_in_chromium_with_no_console_error(tmp_path, browser_ready):
    out, shot = tmp_path / "report.html", tmp_path / "report.png"
    log = busy_log(tmp_path / "busy.jsonl")
    r = subprocess.run(
        [sys.executable, "-m", "cli.audit_app", "report", str(log), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr

    seen = view(out, shot)

    assert seen.console_errors == [] and seen.page_errors == []
    assert seen.requests == []  # offline: plotly's JavaScript is in the page
    assert seen.title.startswith("audit report: ")
    assert [g["id"] for g in seen.graphs] == FIGURES
    assert not seen.undrawn, seen.graphs
    for g in seen.graphs:
        assert g["svg"] >= 1, g  # plotly built its SVG
        assert g["traces"] == g["data"] > 0, g  # and drew every trace it was given
    png = shot.read_bytes()
    assert len(png) > 0 and png[:8] == b"\x89PNG\r\n\x1a\n"
