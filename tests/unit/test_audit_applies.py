"""A claim that does not apply to a log (its ``applies`` selectors match nothing there) is N/A:
it is rendered and written as such and stays out of its window's verdict. It never hides a FAIL
and is never read from an incomplete log (absence there proves nothing)."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson
from rich.console import Console

from audit.parse import parse_spec
from audit.render import print_report, to_json, to_junit
from audit.spec import resolve
from audit.status import Status, merge
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText

CENSUS = {"running": ["r-0"], "parked": [], "waiting": [], "rids": ["r-0"], "backlog": 0}


def weights_cutover(log: LogText, cid: str = "c-1") -> LogText:
    """A clean weights carry of one resident, as the engine writes it."""
    log.r("cutover.begin", id=cid, kind="weights", mode="carry", ceiling=9, path="w.gguf", **CENSUS)
    log.r("cutover.carry", id=cid, rids=[], tokens=0, requeued=["r-0"], requeued_tokens=3)
    return log.r(
        "cutover.end",
        id=cid,
        kind="weights",
        mode="carry",
        outcome="ok",
        status=200,
        **CENSUS | {"running": [], "waiting": ["r-0"]},
        ended=[],
        backlog_before=0,
        rids_before=["r-0"],
        ceiling=9,
        path="w.gguf",
    )


def weights_only_log() -> LogText:
    log = LogText().ready().received("r-0")
    return weights_cutover(log).finish("r-0").stop()


def test_a_clean_weights_only_cutover_passes_the_cutover_window(tmp_path):
    report = evaluate([resolve("cutover")], [weights_only_log().write(tmp_path / "b.log")])
    got = {c.claim: (c.status.value, c.reason) for c in report.specs[0].claims}
    assert got.pop("pool_backlog_not_grown") == ("N/A", "not_applicable")
    assert set(got.values()) == {("PASS", None)}, got
    assert report.status is Status.PASS


SPEC = """description = "t"
[[claim]]
id = "pool_only"
kind = "invariant"
applies = { kind = "cutover.begin", where = { kind = "pool" } }
select = { kind = "cutover.end", where = { kind = "pool" } }
check = "backlog <= backlog_before"
[[claim]]
id = "ready"
kind = "engaged"
select = { kind = "boot.ready" }
"""


def judge(tmp_path: Path, log: LogText):
    return evaluate([parse_spec(SPEC, Path("t/spec.toml"))], [log.write(tmp_path / "b.log")])


def test_not_applicable_stays_out_of_the_merge_and_renders_in_text_json_and_junit(tmp_path):
    report = judge(tmp_path, LogText().ready().stop())
    na, ready = report.specs[0].claims
    assert (na.status, na.reason) == (Status.NOT_APPLICABLE, "not_applicable")
    assert "cutover.begin[kind == 'pool'] never seen" in na.why
    assert report.specs[0].status is Status.PASS and report.status is Status.PASS
    assert merge([Status.NOT_APPLICABLE]) is Status.UNDECIDED  # nothing decided is not a pass
    d = orjson.loads(to_json(report))
    assert d["specs"][0]["claims"][0]["verdict"] == "N/A" and d["verdict"] == "PASS"
    out = io.StringIO()
    print_report(report, Console(file=out, width=200))
    assert "N/A" in out.getvalue() and "not_applicable" in out.getvalue()
    case = ET.fromstring(to_junit(report)).find(".//testcase[@name='pool_only']")
    assert case is not None and case.find("skipped") is not None
    assert ET.fromstring(to_junit(report)).get("skipped") == "1"


def test_a_claim_that_applies_is_decided_as_before(tmp_path):
    log = LogText().ready()
    log.r("cutover.begin", id="c-1", kind="pool", mode="carry", kv_tokens=64, **CENSUS)
    log.r(
        "cutover.end",
        id="c-1",
        kind="pool",
        mode="carry",
        outcome="ok",
        **CENSUS | {"backlog": 9},
        backlog_before=4,
    )
    v = judge(tmp_path, log.stop()).specs[0].claims[0]
    assert v.status is Status.FAIL and "backlog <= backlog_before: 9 <= 4" in v.why


def test_not_applicable_never_hides_a_fail(tmp_path):
    log = LogText().ready()  # a pool end whose begin the engine never wrote
    log.r(
        "cutover.end",
        id="c-1",
        kind="pool",
        mode="carry",
        outcome="ok",
        **CENSUS | {"backlog": 9},
        backlog_before=4,
    )
    assert judge(tmp_path, log.stop()).specs[0].claims[0].status is Status.FAIL


def test_an_incomplete_log_cannot_show_a_claim_does_not_apply(tmp_path):
    log = LogText().ready().r("notice", lose=True, text="x").stop()
    v = judge(tmp_path, log).specs[0].claims[0]
    assert (v.status, v.reason) == (Status.UNDECIDED, "seq_gap")


def test_self_test_asks_a_claim_with_applies_for_a_case_where_it_is_not_applicable(tmp_path):
    from audit.selftest import self_test
    from audit.spec import load_spec, shipped

    src = next(p for p in shipped() if p.name == "cutover")
    (tmp_path / "cases").mkdir()
    (tmp_path / "spec.toml").write_text((src / "spec.toml").read_text())
    for case in (src / "cases").glob("*.toml"):
        text = case.read_text()
        if 'pool_backlog_not_grown = "N/A"' not in text:
            (tmp_path / "cases" / case.name).write_text(text)
    result = self_test(load_spec(tmp_path))
    assert "pool_backlog_not_grown: no case makes it N/A" in result.coverage
    assert self_test(load_spec(src)).ok
