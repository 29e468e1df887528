"""Two boot logs side by side (``audit diff A B``): receipts per kind, the verdicts of the specs,
latency percentiles from ``request.finish`` and pool peaks from ``iteration`` receipts, each a
row with A's value, B's value and what changed.

A number counts as changed when it changes as shown (latencies to 0.1 ms below a second and to
1 ms above, usage to 0.1%), so the marks in the table and ``changed`` in the JSON agree with what
a reader sees. The exit code is 0 whatever changed: two real runs always differ in timing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rich.table import Table
from rich.text import Text

from audit.model import Spec
from audit.reader import scan
from audit.render import STYLE
from audit.report_data import percentile
from audit.spec import load_spec, resolve, shipped
from audit.status import Status
from audit.verdict import Report, evaluate
from engine.observability import schema

Value = int | float | str | None
NA = "n/a"  # a spec whose regime this log never reached (only when the specs are the shipped ones)
TIMINGS = ("ttft_s", "e2e_s")  # request.finish fields, seconds
PERCENTILES = (50, 90, 99)
PEAKS = ("token_usage", "running", "waiting", "parked")  # iteration fields, max over the log
_WORSE = {Status.PASS.value: 0, Status.UNDECIDED.value: 1, Status.FAIL.value: 2}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass(slots=True)
class Profile:
    """One log's numbers: its report (verdicts and read stats), timings and pool peaks."""

    log: str
    report: Report
    timings: dict[str, list[float]]  # TIMINGS field -> every finished request's value
    peaks: dict[str, float]  # PEAKS field -> max over every iteration receipt that carries it
    iterations: int

    def verdicts(self) -> dict[str, str]:
        """Spec name -> verdict, and "spec.claim" -> verdict for each of its claims."""
        out = {s.spec: s.status.value for s in self.report.specs}
        out |= {name: NA for name, _ in self.report.not_applicable}
        for s in self.report.specs:
            out |= {f"{s.spec}.{c.claim}": c.status.value for c in s.claims}
        return out


def profile(log: str | Path, specs: list[Spec], only_applicable: bool) -> Profile:
    """Read ``log`` for its verdicts (one pass, as ``audit verdict``) and its numbers (one more)."""
    report = evaluate(specs, [log], only_applicable=only_applicable)
    timings: dict[str, list[float]] = {f: [] for f in TIMINGS}
    peaks: dict[str, float] = {}
    iterations = 0

    def on_receipt(rec: dict[str, Any]) -> None:
        nonlocal iterations
        if rec["event"] == schema.REQUEST_FINISH:
            for f in TIMINGS:
                if _number(rec.get(f)):
                    timings[f].append(float(rec[f]))
        elif rec["event"] == schema.ITERATION:
            iterations += 1
            for f in PEAKS:
                v = rec.get(f)
                if _number(v) and (f not in peaks or v > peaks[f]):
                    peaks[f] = v

    scan([log], on_receipt)
    return Profile(str(log), report, timings, peaks, iterations)


@dataclass(frozen=True, slots=True)
class Row:
    section: str  # read, receipts, verdicts, claims, latency, pool
    name: str
    a: Value
    b: Value
    unit: str = ""  # "s" (seconds, shown in ms), "frac" (shown as %), "verdict", or plain

    def shown(self, v: Value) -> str:
        if v is None:
            return "-"
        if self.unit == "s":
            return f"{v * 1000:.1f} ms" if abs(v) < 1 else f"{v:.3f} s"
        if self.unit == "frac":
            return f"{v:.1%}"
        return str(v)

    @property
    def changed(self) -> bool:
        return self.shown(self.a) != self.shown(self.b)

    def delta(self) -> str:
        """What changed from A to B, in the row's unit; empty when nothing did."""
        a, b = self.a, self.b
        if not self.changed:
            return ""
        if a is None or b is None:
            return "only in B" if a is None else "only in A"
        if self.unit == "s":
            return f"{(b - a) / a:+.0%}" if a else f"{(b - a) * 1000:+.1f} ms"
        if self.unit == "frac":
            return f"{(b - a) * 100:+.1f} pp"
        if isinstance(a, int) and isinstance(b, int):
            return f"{b - a:+d}"
        return f"{self.shown(a)} -> {self.shown(b)}"

    def style(self) -> str:
        if not self.changed:
            return ""
        if self.unit == "verdict" and self.a in _WORSE and self.b in _WORSE:
            return "bold red" if _WORSE[self.b] > _WORSE[self.a] else "bold green"
        return "bold yellow"

    def as_dict(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "name": self.name,
            "a": self.a,
            "b": self.b,
            "changed": self.changed,
            "delta": self.delta(),
        }


def _read_rows(pa: Profile, pb: Profile) -> list[Row]:
    def facts(p: Profile) -> dict[str, Value]:
        st = p.report.stats
        inc = st.incomplete()
        return {
            "receipts": st.receipts,
            "unparsed lines": st.garbage + st.truncated,
            "malformed": st.malformed,
            "ranks": len(st.ranks),
            "boots": len({boot for boot, _ in st.seqs}),
            "complete": "yes" if inc is None else f"no ({inc[0]})",
        }

    fa, fb = facts(pa), facts(pb)
    return [Row("read", k, fa[k], fb[k]) for k in fa]


def _count_rows(pa: Profile, pb: Profile) -> list[Row]:
    def per_kind(p: Profile) -> dict[str, int]:
        out: dict[str, int] = {}
        for (_, kind), n in p.report.stats.kinds.items():
            out[kind] = out.get(kind, 0) + n
        return out

    ka, kb = per_kind(pa), per_kind(pb)
    return [Row("receipts", k, ka.get(k, 0), kb.get(k, 0)) for k in sorted(ka.keys() | kb.keys())]


def _verdict_rows(pa: Profile, pb: Profile, specs: list[Spec]) -> list[Row]:
    va, vb = pa.verdicts(), pb.verdicts()
    rows = [Row("verdicts", "overall", pa.report.status.value, pb.report.status.value, "verdict")]
    rows += [Row("verdicts", s.name, va.get(s.name), vb.get(s.name), "verdict") for s in specs]
    for s in specs:
        for c in s.claims:
            key = f"{s.name}.{c.id}"
            rows.append(Row("claims", key, va.get(key), vb.get(key), "verdict"))
    return rows


def _number_rows(pa: Profile, pb: Profile) -> list[Row]:
    rows = []
    for f in TIMINGS:
        ta, tb = pa.timings[f], pb.timings[f]
        rows.append(Row("latency", f"{f} n", len(ta), len(tb)))
        for q in PERCENTILES:
            rows.append(Row("latency", f"{f} p{q}", percentile(ta, q), percentile(tb, q), "s"))
    rows.append(Row("pool", "iteration receipts", pa.iterations, pb.iterations))
    for f in PEAKS:
        unit = "frac" if f == "token_usage" else ""
        rows.append(Row("pool", f"{f} max", pa.peaks.get(f), pb.peaks.get(f), unit))
    return rows


@dataclass(slots=True)
class Diff:
    a: Profile
    b: Profile
    specs: list[Spec]
    rows: list[Row]

    def as_dict(self) -> dict[str, Any]:
        def side(p: Profile) -> dict[str, Any]:
            d = p.report.as_dict()
            return {k: d[k] for k in ("logs", "verdict", "read", "complete", "incomplete")} | {
                "not_applicable": d["not_applicable"]
            }

        return {
            "a": side(self.a),
            "b": side(self.b),
            "specs": [s.name for s in self.specs],
            "changed": sum(r.changed for r in self.rows),
            "rows": [r.as_dict() for r in self.rows],
        }


def compare(a: str | Path, b: str | Path, spec_names: list[str] | None = None) -> Diff:
    """A and B read with the same specs: the named ones, else every shipped window (each left
    ``n/a`` on a side whose log never reached its regime, as ``audit verdict`` leaves it out)."""
    if spec_names:
        specs, only_applicable = [resolve(s) for s in spec_names], False
    else:
        specs, only_applicable = [load_spec(p) for p in shipped()], True
    pa, pb = profile(a, specs, only_applicable), profile(b, specs, only_applicable)
    rows = [*_read_rows(pa, pb), *_count_rows(pa, pb), *_verdict_rows(pa, pb, specs)]
    return Diff(pa, pb, specs, rows + _number_rows(pa, pb))


def to_json(d: Diff) -> str:
    return orjson.dumps(d.as_dict(), option=orjson.OPT_INDENT_2).decode()


def diff_table(d: Diff) -> Table:
    """One table, a heading row per section. Claims show only where their verdict changed."""
    changed = sum(r.changed for r in d.rows)
    table = Table(
        title=f"audit diff: {changed} row(s) changed",
        caption=f"A = {d.a.log}\nB = {d.b.log}",
    )
    table.add_column("")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_column("change")
    section = None
    for r in d.rows:
        if r.section == "claims" and not r.changed:
            continue
        if r.section != section:
            section = r.section
            table.add_row(Text(section, style="bold underline"), "", "", "")
        style = r.style()
        table.add_row(
            Text(f"  {r.name}", style=style),
            Text(r.shown(r.a), style=_verdict_style(r.a)),
            Text(r.shown(r.b), style=_verdict_style(r.b)),
            Text(r.delta(), style=style),
        )
    return table


def _verdict_style(v: Value) -> str:
    return STYLE[Status(v)] if isinstance(v, str) and v in _WORSE else ""
