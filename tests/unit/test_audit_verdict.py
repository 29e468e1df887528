"""Verdicts merge FAIL > UNDECIDED > PASS; the report renders as a table, JSON and JUnit, where
an UNDECIDED claim is an error, never skipped."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson
from rich.console import Console

from audit.readstats import ReadStats
from audit.render import print_report, to_json, to_junit
from audit.status import ClaimVerdict, Status, merge
from audit.verdict import Report, SpecVerdict

P, F, U = Status.PASS, Status.FAIL, Status.UNDECIDED


def test_merge_is_fail_then_undecided_then_pass():
    assert merge([P, P]) is P
    assert merge([P, U, P]) is U
    assert merge([U, F, P]) is F
    assert merge([]) is U  # nothing decided is not a pass
    assert [s.exit_code for s in (P, F, U)] == [0, 1, 2]


def report() -> Report:
    claims = [
        ClaimVerdict("a", "engaged", P, "3 admission.park seen (>= 1)", None, {"seen": 3}),
        ClaimVerdict("b", "every", F, "1 of 3 rids lost: r-7 (rank 0)", None, {"failed": 1}),
        ClaimVerdict("c", "ratio", U, "engagements = 0", "zero_denominator", {}),
    ]
    return Report(["boot.log"], [SpecVerdict("w", "a window", claims)], ReadStats())


def test_json_carries_every_verdict_reason_and_number():
    d = orjson.loads(to_json(report()))
    assert d["verdict"] == "FAIL" and d["exit_code"] == 1
    got = [(c["claim"], c["verdict"], c["reason"]) for c in d["specs"][0]["claims"]]
    assert got == [("a", "PASS", None), ("b", "FAIL", None), ("c", "UNDECIDED", "zero_denominator")]
    assert d["specs"][0]["claims"][0]["numbers"] == {"seen": 3}


def test_junit_undecided_is_an_error_never_skipped():
    root = ET.fromstring(to_junit(report()))
    suite = root.find("testsuite")
    assert (
        suite.get("tests"),
        suite.get("failures"),
        suite.get("errors"),
        suite.get("skipped"),
    ) == ("3", "1", "1", "0")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["a"].find("failure") is None and cases["a"].find("error") is None
    assert cases["b"].find("failure").get("message").startswith("1 of 3 rids lost")
    err = cases["c"].find("error")
    assert err is not None and err.get("type") == "zero_denominator"
    assert root.find(".//skipped") is None


def test_the_table_shows_verdicts_reasons_and_sentences():
    buf = io.StringIO()
    print_report(report(), Console(file=buf, width=200))
    out = buf.getvalue()
    for text in ("w: FAIL", "zero_denominator", "r-7 (rank 0)", "overall: FAIL"):
        assert text in out


def test_report_of_no_spec_is_undecided():
    assert Report([str(Path("x"))], [], ReadStats()).status is U


def test_the_table_prints_spec_and_log_text_as_written_never_as_markup():
    claims = [
        ClaimVerdict(
            "q", "final", F, "last sglang_batch line[queue == 0]: [bold]7[/bold]", None, {}
        )
    ]
    rep = Report(
        ["x"], [SpecVerdict("w", "see [red]this[/red] line[queue == 0]", claims)], ReadStats()
    )
    buf = io.StringIO()
    print_report(rep, Console(file=buf, width=200))
    out = buf.getvalue()
    assert "line[queue == 0]: [bold]7[/bold]" in out
    assert "see [red]this[/red] line[queue == 0]" in out
