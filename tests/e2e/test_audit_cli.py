"""The `audit` command's exit codes follow sysexits: a usage error is 64, never click's 2."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import orjson
import pytest

from tests.e2e.audit_cli import CASES, audit, case_log


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


# -- verdicts and the sysexits of `audit verdict` -----------------------------------------------


@pytest.mark.parametrize(
    ("case", "code", "word"),
    [("pass", 0, "PASS"), ("fail", 1, "FAIL"), ("null_no_eviction", 2, "UNDECIDED")],
)
def test_verdict_exit_codes_are_0_1_2(tmp_path, case, code, word):
    r = audit("verdict", case_log(tmp_path, "eviction_honesty", case), "--spec", "eviction_honesty")
    assert r.returncode == code, r.stdout + r.stderr
    assert f"overall: {word}" in r.stdout


def test_verdict_json_and_junit(tmp_path):
    log = case_log(tmp_path, "no_request_lost", "fail_after_stop")
    junit = tmp_path / "out.xml"
    r = audit("verdict", log, "--spec", "no_request_lost", "--json", "--junit", str(junit))
    assert r.returncode == 1
    d = orjson.loads(r.stdout)
    claim = d["specs"][0]["claims"][0]
    assert (claim["claim"], claim["verdict"]) == ("every_request_ends", "FAIL")
    assert "r-1 (rank 0), r-2 (rank 0)" in claim["why"]
    assert ET.parse(junit).getroot().get("failures") == "3"


def test_verdict_without_spec_runs_every_window_that_applies(tmp_path):
    r = audit("verdict", case_log(tmp_path, "boot_health", "pass"), "--json")
    d = orjson.loads(r.stdout)
    assert {s["spec"] for s in d["specs"]} == {
        "boot_health",
        "no_request_lost",
        "admission_park",
        "eviction_honesty",
        "relief_ladder",
        "speculation",
    }
    assert r.returncode == 2  # admission_park and others never engaged: UNDECIDED, not PASS
    text = tmp_path / "foreign.log"
    text.write_text("some other engine's log\n")
    r = audit("verdict", str(text), "--json")
    d = orjson.loads(r.stdout)
    assert d["specs"] == [] and len(d["not_applicable"]) == 12 and r.returncode == 2


def test_a_bad_spec_is_64_with_the_reason(tmp_path):
    bad = tmp_path / "spec.toml"
    bad.write_text(
        '[[claim]]\nid = "c"\nkind = "engaged"\nselect = { kind = "eviction", where = { acked = 72 } }\n'
    )
    r = audit("verdict", case_log(tmp_path, "boot_health", "pass"), "--spec", str(bad))
    assert r.returncode == 64 and "has no field 'acked'" in r.stderr
    r = audit("verdict", case_log(tmp_path, "boot_health", "pass"), "--spec", "no_such_window")
    assert r.returncode == 64 and "no spec 'no_such_window'" in r.stderr
    r = audit("verdict")
    assert r.returncode == 64 and "Missing argument" in r.stderr


def test_unreadable_input_is_66(tmp_path):
    r = audit("verdict", str(tmp_path / "missing.log"))
    assert r.returncode == 66 and "missing.log" in r.stderr
    gz = tmp_path / "bad.gz"
    gz.write_bytes(b"\x1f\x8bnot gzip at all")
    assert audit("summary", str(gz)).returncode == 66
    log = case_log(tmp_path, "relief_ladder", "pass")
    r = audit("verdict", log, "--spec", "relief_ladder", "--control", str(tmp_path / "nope"))
    assert r.returncode == 66


def test_an_internal_error_is_70_with_the_reason(tmp_path, monkeypatch, capsys):
    import cli.audit_app as app

    def boom(*a, **k):
        raise RuntimeError("checker exploded")

    monkeypatch.setattr(app, "evaluate", boom)
    with pytest.raises(SystemExit) as e:
        app.main(["verdict", case_log(tmp_path, "boot_health", "pass")])
    assert e.value.code == 70
    assert "internal error: RuntimeError: checker exploded" in capsys.readouterr().err


def test_self_test_specs_explain_summary(tmp_path):
    r = audit("self-test")
    assert r.returncode == 0 and "relief_ladder: ok" in r.stdout
    r = audit("specs")
    assert r.returncode == 0 and "parks_below_a_page (invariant)" in r.stdout
    log = case_log(tmp_path, "no_request_lost", "pass")
    r = audit("explain", log, "--rid", "r-1")
    assert r.returncode == 0
    assert [
        e for e in ("request.received", "retract", "requeue", "request.finish") if e not in r.stdout
    ] == []
    assert audit("explain", log, "--rid", "r-404").returncode == 1
    r = audit("summary", log)
    assert r.returncode == 0 and "request.received" in r.stdout


def test_self_test_fails_when_a_case_disagrees(tmp_path):
    w = tmp_path / "w"
    (w / "cases").mkdir(parents=True)
    (w / "spec.toml").write_text((CASES / "eviction_honesty" / "spec.toml").read_text())
    (w / "cases" / "pass.toml").write_text(
        (CASES / "eviction_honesty" / "cases" / "pass.toml")
        .read_text()
        .replace('overall = "PASS"', 'overall = "FAIL"')
    )
    r = audit("self-test", str(w))
    assert r.returncode == 1
    assert "overall: expected FAIL, got PASS" in r.stdout and "no case makes it FAIL" in r.stdout
