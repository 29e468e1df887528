"""`audit diff A B` through the command line: the table, --json, and sysexits (66 for an
unreadable log with the reason, 64 for a usage error or a bad spec)."""

from __future__ import annotations

import orjson
import pytest

from tests.e2e.audit_cli import audit
from tests.unit.audit_logs import LogText


@pytest.fixture
def logs(tmp_path) -> tuple[str, str]:
    a = LogText().ready().received("r-1").received("r-2")
    a.r("iteration", running=2, waiting=0, token_usage=0.25)
    a.finish("r-1", ttft_s=0.01, e2e_s=0.1).finish("r-2", ttft_s=0.02, e2e_s=0.2).stop()
    b = LogText().ready().received("r-1").received("r-2")
    b.r("iteration", running=1, waiting=1, token_usage=0.5)
    b.finish("r-1", ttft_s=0.01, e2e_s=0.1).stop()  # r-2 is lost: no_request_lost FAILs
    return str(a.write(tmp_path / "a.jsonl")), str(b.write(tmp_path / "b.jsonl"))


def test_the_table_marks_what_changed_and_exits_0(logs):
    r = audit("diff", *logs)
    assert r.returncode == 0, r.stderr
    assert "audit diff:" in r.stdout and f"A = {logs[0]}" in r.stdout
    for line in ("request.finish", "no_request_lost.every_request_ends", "token_usage max"):
        assert line in r.stdout
    row = next(x for x in r.stdout.splitlines() if "every_request_ends" in x)
    assert "PASS -> FAIL" in row
    row = next(x for x in r.stdout.splitlines() if "token_usage max" in x)
    assert "+25.0 pp" in row


def test_json_with_a_named_spec(logs):
    r = audit("diff", *logs, "--spec", "no_request_lost", "--json")
    assert r.returncode == 0, r.stderr
    d = orjson.loads(r.stdout)
    assert d["specs"] == ["no_request_lost"]
    rows = {(x["section"], x["name"]): x for x in d["rows"]}
    lost = rows[("verdicts", "no_request_lost")]
    assert (lost["a"], lost["b"], lost["changed"]) == ("PASS", "FAIL", True)
    assert rows[("receipts", "request.finish")] | {"section": 0} == {
        "section": 0,
        "name": "request.finish",
        "a": 2,
        "b": 1,
        "changed": True,
        "delta": "-1",
    }
    assert (d["a"]["verdict"], d["b"]["verdict"]) == ("PASS", "FAIL")


def test_unreadable_input_is_66_with_the_reason(logs, tmp_path):
    r = audit("diff", logs[0], str(tmp_path / "missing.jsonl"))
    assert r.returncode == 66 and "missing.jsonl" in r.stderr, r.stderr
    assert "cannot read log" in r.stderr
    r = audit("diff", str(tmp_path), logs[1])
    assert r.returncode == 66 and "is a directory" in r.stderr
    gz = tmp_path / "bad.gz"
    gz.write_bytes(b"\x1f\x8bnot gzip at all")
    assert audit("diff", logs[0], str(gz), "--json").returncode == 66


def test_usage_errors_are_64(logs):
    r = audit("diff", logs[0])
    assert r.returncode == 64 and "Missing argument" in r.stderr
    r = audit("diff", *logs, "--spec", "no_such_window")
    assert r.returncode == 64 and "no spec 'no_such_window'" in r.stderr
    r = audit("diff", *logs, "--frobnicate")
    assert r.returncode == 64 and "--frobnicate" in r.stderr
