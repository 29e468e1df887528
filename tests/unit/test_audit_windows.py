"""The shipped acceptance windows: each spec loads, each case agrees with its spec, and every
claim has a case that makes it FAIL (where its kind can fail) and one that makes it UNDECIDED.
The auditor imports no torch and nothing of the engine but the receipt schema."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from audit.kinds import KINDS
from audit.selftest import self_test
from audit.spec import load_spec, shipped

WINDOWS = {
    "boot_health",
    "no_request_lost",
    "admission_park",
    "eviction_honesty",
    "relief_ladder",
    "cutover",
    "group_agreement",
    "speculation",
}


def test_the_five_windows_ship():
    assert {p.name for p in shipped()} >= WINDOWS


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_every_case_agrees_and_every_claim_can_fail_and_be_undecided(window):
    spec = load_spec(next(p for p in shipped() if p.name == window))
    result = self_test(spec)
    problems = [f"{c.name}: {p}" for c in result.cases for p in c.problems] + result.coverage
    assert problems == []
    assert len(result.cases) >= 3
    failing = {cid for c in result.cases for cid, v in c.got.items() if v == "FAIL"}
    assert failing >= {c.id for c in spec.claims if KINDS[c.kind].can_fail}


def test_self_test_reports_a_claim_without_a_failing_case(tmp_path):
    src = next(p for p in shipped() if p.name == "eviction_honesty")
    (tmp_path / "cases").mkdir()
    (tmp_path / "spec.toml").write_text((src / "spec.toml").read_text())
    for case in (src / "cases").glob("*.toml"):
        if case.stem != "fail":
            (tmp_path / "cases" / case.name).write_text(case.read_text())
    result = self_test(load_spec(tmp_path))
    assert not result.ok
    assert "never_under_delivered: no case makes it FAIL" in result.coverage


def test_self_test_reports_a_case_that_disagrees(tmp_path):
    src = next(p for p in shipped() if p.name == "eviction_honesty")
    (tmp_path / "cases").mkdir()
    (tmp_path / "spec.toml").write_text((src / "spec.toml").read_text())
    text = (src / "cases" / "fail.toml").read_text()
    (tmp_path / "cases" / "fail.toml").write_text(
        text.replace('never_under_delivered = "FAIL"', 'never_under_delivered = "PASS"')
    )
    result = self_test(load_spec(tmp_path))
    assert not result.ok
    assert any(
        "never_under_delivered: expected PASS, got FAIL" in p for p in result.cases[0].problems
    )


def test_importing_the_whole_auditor_pulls_in_no_torch_and_no_engine_internals():
    code = textwrap.dedent(
        """
        import sys
        import audit, audit.reader, audit.spec, audit.kinds, audit.verdict, audit.render
        import audit.expr, audit.selftest, audit.explain, cli.audit_app
        bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")
                     or (m.startswith("engine.") and m not in ("engine.observability", "engine.observability.schema")))
        print(bad)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout
