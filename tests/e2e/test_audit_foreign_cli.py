"""`audit verdict` on foreign engines' plain-text logs (no receipt at all): the sglang_pressure and
vllm_pressure windows decide from the text alone, apply by themselves to such a log, and a spec
whose text event is not scoped by a log prefix is a bad spec (64), never a verdict."""

from __future__ import annotations

import orjson
import pytest

from tests.e2e.audit_cli import audit, case_log


@pytest.mark.parametrize(
    ("window", "case", "code"),
    [
        ("sglang_pressure", "pass", 0),
        ("sglang_pressure", "fail_not_drained", 1),
        ("sglang_pressure", "cut_without_shutdown", 2),
        ("vllm_pressure", "pass", 0),
        ("vllm_pressure", "fail_engine_oom", 1),
        ("vllm_pressure", "v1_no_preemption_line", 2),
    ],
)
def test_a_text_log_without_receipts_gets_a_verdict(tmp_path, window, case, code):
    log = case_log(tmp_path, window, case)
    r = audit("verdict", log, "--spec", window, "--json")
    assert r.returncode == code, r.stdout + r.stderr
    report = orjson.loads(r.stdout)
    assert report["read"]["receipts"] == 0 and report["complete"]
    assert [s["spec"] for s in report["specs"]] == [window]


def test_a_text_log_picks_its_window_by_itself(tmp_path):
    r = audit("verdict", case_log(tmp_path, "sglang_pressure", "pass"), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = orjson.loads(r.stdout)
    assert [s["spec"] for s in report["specs"]] == ["sglang_pressure"]
    skipped = {n["spec"]: n["why"] for n in report["not_applicable"]}
    assert "boot_health" in skipped and "vllm_pressure" in skipped


def test_a_text_event_without_a_prefix_is_a_bad_spec_64(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'description = "t"\n'
        "[event.retraction]\n"
        "regex = 'KV cache pool is full\\. Retract requests\\. #retracted_reqs: (?P<n>\\d+)(?:, .*)?'\n"
        '[[claim]]\nid = "seen"\nkind = "engaged"\nselect = { kind = "retraction" }\n'
    )
    log = case_log(tmp_path, "sglang_pressure", "pass")
    r = audit("verdict", log, "--spec", str(spec))
    assert r.returncode == 64, r.stdout + r.stderr
    assert "bad spec" in r.stderr and "needs 'prefix'" in r.stderr
    spec.write_text(
        spec.read_text().replace("[event.retraction]\n", '[event.retraction]\nprefix = "sglang"\n')
    )
    assert audit("verdict", log, "--spec", str(spec)).returncode == 0
