"""A report three ways: a Rich table for people, JSON and JUnit XML for machines.

In JUnit an UNDECIDED claim is an ``<error>`` (the evidence was not there), never
``<skipped>``: a CI dashboard must not show an unanswered question as green. ``<skipped>`` is
kept for an N/A claim, one that does not apply to the log.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from audit.status import Status
from audit.verdict import Report

STYLE = {
    Status.PASS: "bold green",
    Status.FAIL: "bold red",
    Status.UNDECIDED: "bold yellow",
    Status.NOT_APPLICABLE: "dim",
}


def to_json(report: Report) -> str:
    return orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2).decode()


def to_junit(report: Report) -> str:
    root = ET.Element("testsuites", name="audit")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for sv in report.specs:
        suite = ET.SubElement(root, "testsuite", name=sv.spec)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for cv in sv.claims:
            counts["tests"] += 1
            case = ET.SubElement(
                suite, "testcase", classname=f"acceptance.{sv.spec}", name=cv.claim
            )
            if cv.status is Status.FAIL:
                counts["failures"] += 1
                el = ET.SubElement(case, "failure", message=cv.why, type=cv.reason or "FAIL")
                el.text = cv.why
            elif cv.status is Status.UNDECIDED:
                counts["errors"] += 1
                el = ET.SubElement(case, "error", message=cv.why, type=cv.reason or "UNDECIDED")
                el.text = f"UNDECIDED ({cv.reason}): {cv.why}"
            elif cv.status is Status.NOT_APPLICABLE:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=cv.why, type=cv.reason or "N/A")
            else:
                ET.SubElement(case, "system-out").text = cv.why
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def print_report(report: Report, console: Console | None = None) -> None:
    console = console or Console()
    st = report.stats
    if report.window is not None:  # what every verdict below is relative to, said first
        console.print(
            Text(
                f"live window: a server still running, judged to its last line "
                f"({report.window.describe()}): claims about the end of the run are decided as of "
                "there; what is still open there (a request in flight) stays UNDECIDED",
                style="bold",
            )
        )
    for sv in report.specs:
        # every text from a spec or a log is plain, never Rich markup: a selector such as
        # `line[queue == 0]` must print as written
        table = Table(
            title=Text(f"{sv.spec}: {sv.status.value}"),
            caption=Text(sv.description) if sv.description else None,
            show_lines=True,
            expand=False,
        )
        table.add_column("claim", no_wrap=True)
        table.add_column("verdict", no_wrap=True)
        table.add_column("reason", no_wrap=True)
        table.add_column("why (with the numbers)")
        for cv in sv.claims:
            table.add_row(
                Text(cv.claim),
                Text(cv.status.value, style=STYLE[cv.status]),
                Text(cv.reason or ""),
                Text(cv.why),
            )
        console.print(table)
    for name, why in report.not_applicable:
        console.print(Text(f"{name}: not applicable ({why})", style="dim"))
    console.print(
        f"read {st.files} file(s), {st.lines} lines: {st.receipts} receipts, "
        f"{st.text} text, {st.foreign_json} foreign JSON, {st.garbage} garbage, "
        f"{st.truncated} truncated, {st.malformed} malformed, {st.unknown_kind} unknown kind; "
        f"ranks {sorted(st.ranks) or '-'}"
    )
    incomplete = st.incomplete()
    if incomplete:
        console.print(Text(f"incomplete log ({incomplete[0]}): {incomplete[1]}", style="yellow"))
    overall = report.status
    console.print(Text(f"overall: {overall.value}", style=STYLE[overall]))
