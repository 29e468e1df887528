"""`audit report LOG... -o FILE`: the page is written and the exit codes follow sysexits, like
`audit verdict` (66 unreadable log, 73 unwritable file, 64 bad spec, 69 without plotly)."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.report_logs import busy_log, quiet_log


def audit(*args: str, prelude: str = "") -> subprocess.CompletedProcess:
    code = f"{prelude}\nfrom cli.audit_app import main\nmain({list(args)!r})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_a_report_is_written_and_exits_0_whatever_the_verdict(tmp_path):
    out = tmp_path / "report.html"
    r = audit("report", str(busy_log(tmp_path / "busy.jsonl")), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert f"wrote {out} (318 receipts; verdict " in r.stdout
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "fig-timeline" in html


def test_a_log_without_iteration_receipts_still_makes_a_report(tmp_path):
    out = tmp_path / "quiet.html"
    r = audit("report", str(quiet_log(tmp_path / "quiet.jsonl")), "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert "no data: no iteration receipts in these logs" in out.read_text(encoding="utf-8")


def test_an_unreadable_log_is_66_with_the_reason_and_writes_nothing(tmp_path):
    out = tmp_path / "report.html"
    missing = tmp_path / "nope.jsonl"
    r = audit("report", str(busy_log(tmp_path / "ok.jsonl")), str(missing), "-o", str(out))
    assert r.returncode == 66
    assert r.stderr.strip() == f"audit: cannot read log: {missing}: No such file or directory"
    assert not out.exists()
    empty = tmp_path / "empty"  # a directory is read as the logs in it; one with none is 64
    empty.mkdir()
    r = audit("report", str(empty), "-o", str(out))
    assert (r.returncode, "holds no log" in r.stderr) == (64, True)
    assert not out.exists()


def test_an_unwritable_output_is_73_naming_it(tmp_path):
    out = tmp_path / "no-such-dir" / "report.html"
    r = audit("report", str(quiet_log(tmp_path / "quiet.jsonl")), "-o", str(out))
    assert r.returncode == 73
    assert f"cannot write {out}: No such file or directory" in r.stderr


def test_a_bad_spec_is_64(tmp_path):
    r = audit("report", str(quiet_log(tmp_path / "q.jsonl")), "--spec", "no_such_window")
    assert r.returncode == 64 and "bad spec" in r.stderr


def test_without_plotly_the_report_says_which_extra_to_install_69(tmp_path):
    out = tmp_path / "report.html"
    hide = "import sys; sys.modules['plotly'] = None  # as on a base install"
    r = audit("report", str(quiet_log(tmp_path / "q.jsonl")), "-o", str(out), prelude=hide)
    assert r.returncode == 69, r.stderr
    assert r.stderr.strip() == "audit: `audit report` needs plotly: pip install 'attest[audit]'"
    assert not out.exists()
    # the rest of the auditor does not need it
    assert audit("summary", str(tmp_path / "q.jsonl"), prelude=hide).returncode == 0


def test_a_verdict_read_by_two_processes_prints_what_one_prints(tmp_path):
    log = str(busy_log(tmp_path / "busy.jsonl"))
    one = audit("verdict", log, "--json", "--jobs", "1")
    two = audit("verdict", log, "--json", "--jobs", "2")  # forks whatever the log's size
    assert (one.returncode, one.stdout) == (two.returncode, two.stdout)
    assert one.returncode in (0, 1, 2) and '"specs"' in one.stdout, one.stderr
    bad = audit("verdict", log, "--jobs", "-1")
    assert bad.returncode == 64 and "Invalid value for '--jobs'" in bad.stderr
