"""`audit report`: one self-contained HTML page for people, from boot logs and their verdicts.

Sections: the verdict table; pool usage over time (used / cached / evictable / staged / free,
stacked to the capacity from iterations, and each layer from every receipt that carries it);
pressure events on a timeline (parks, retractions, evictions, relief rungs, the allocation net,
aborts); queue depth; progress (the iterations' counters) and the scheduler's stalls, shaded on
every time figure; per-request latency distributions (TTFT, E2E); ranks (receipts per kind and
rank, the published floor) and cutovers where the logs have them. The time figures are
`audit/report_time.py`; which receipts speak for which series, `audit/report_series.py`.

Plotly draws the figures; its JavaScript is embedded once in the page, so the file opens offline
and fetches nothing. A section with nothing to draw says so ("no data") instead of vanishing.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime

import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline
from plotly.subplots import make_subplots

from audit.report_data import CUTOVER_KINDS, ReportData, percentile
from audit.report_series import POOL_SERIES, PROGRESS_SERIES, QUEUE_SERIES
from audit.report_time import X_TITLE, keys_with, mark, pool_figure, progress_figure, queue_figure
from audit.verdict import Report

_CONFIG = {"displaylogo": False, "responsive": True}
# one colour per timeline lane, so a lane keeps its colour whichever lanes have events
_LANE_COLOURS = (
    "#1f77b4",
    "#17becf",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#ff7f0e",
    "#7f7f7f",
    "#d62728",
    "#bcbd22",
    "#000000",
)
_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1300px}
h1{margin-bottom:4px} h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0 16px} td,th{border:1px solid #ddd;padding:4px 8px;
text-align:left;vertical-align:top} th{background:#f4f4f4} td.num{text-align:right}
.PASS{color:#fff;background:#2e7d32} .FAIL{color:#fff;background:#c62828}
.UNDECIDED{color:#222;background:#fbc02d} .verdict{font-weight:bold;white-space:nowrap}
.nodata{color:#777;font-style:italic} .warn{background:#fff3cd;padding:8px;border:1px solid #e0c36c}
.meta{color:#555}
"""


_NO_ITERATIONS = "no iteration receipts in these logs"


def _esc(v: object) -> str:
    return html.escape(str(v), quote=True)


def _nodata(why: str) -> str:
    return f'<p class="nodata">no data: {_esc(why)}</p>'


def _table(head: list[str], rows: list[list[str]], num_from: int = 99) -> str:
    """An HTML table; cells are already escaped. Columns from ``num_from`` align right."""
    th = "".join(f"<th>{h}</th>" for h in head)

    def cell(i: int, c: str) -> str:
        return f'<td class="num">{c}</td>' if i >= num_from else f"<td>{c}</td>"

    body = "".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _figure_html(fig: go.Figure, div_id: str, height: int = 380) -> str:
    fig.update_layout(
        height=height, template="plotly_white", margin={"l": 60, "r": 20, "t": 40, "b": 50}
    )
    return pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=div_id, config=_CONFIG)


# -- sections -------------------------------------------------------------------------------------


def verdict_section(report: Report) -> str:
    st = report.status.value
    parts = [f'<h2 id="verdicts">Verdicts: <span class="verdict {st}">&nbsp;{st}&nbsp;</span></h2>']
    if not report.specs:
        parts.append(_nodata("no spec applies to these logs: nothing was decided (UNDECIDED)"))
    for sv in report.specs:
        s = sv.status.value
        parts.append(f'<h3>{_esc(sv.spec)}: <span class="verdict {s}">&nbsp;{s}&nbsp;</span></h3>')
        if sv.description:
            parts.append(f'<p class="meta">{_esc(sv.description)}</p>')
        rows = [
            [
                _esc(c.claim),
                f'<span class="verdict {c.status.value}">{c.status.value}</span>',
                _esc(c.reason or ""),
                _esc(c.why),
            ]
            for c in sv.claims
        ]
        parts.append(_table(["claim", "verdict", "reason", "why (with the numbers)"], rows))
    for name, why in report.not_applicable:
        parts.append(f'<p class="meta">{_esc(name)}: not applicable ({_esc(why)})</p>')
    return "\n".join(parts)


def pool_section(data: ReportData) -> str:
    parts = ['<h2 id="pool">Pool usage over time</h2>']
    keys = sorted(set(data.pool) | set(keys_with(data, POOL_SERIES)))
    if not keys:
        return parts[0] + _nodata(f"{_NO_ITERATIONS}, and no other receipt carries a pool number")
    for i, key in enumerate(keys):
        label = _esc(data.label(key))
        if key not in data.pool:
            parts.append(
                f'<p class="meta">{label}: no iteration receipt, so no moment with every layer: '
                "the layers other receipts carry are drawn, each on its own</p>"
            )
        elif key not in data.capacity:
            parts.append(
                f'<p class="meta">{label}: no boot.pool_sized receipt, so the '
                "pool's size and its used layer are unknown; the other layers are drawn</p>"
            )
        parts.append(_figure_html(pool_figure(data, key), f"fig-pool-{i}", height=560))
    return "\n".join(parts)


def timeline_section(data: ReportData) -> str:
    head = '<h2 id="timeline">Parks, retractions, evictions and relief on a timeline</h2>'
    lanes = list(data.lanes)
    if not any(data.lanes.values()):
        return head + _nodata("no park, retraction, eviction, relief or allocation-net receipt")
    fig = go.Figure()
    for i, lane in enumerate(lanes):
        events = data.lanes[lane]
        if not events:
            continue
        colour = _LANE_COLOURS[i % len(_LANE_COLOURS)]
        fig.add_trace(
            go.Scatter(
                x=[data.rel(e.t) for e in events],
                y=[i] * len(events),
                mode="markers",
                name=lane,
                marker={"size": 9, "symbol": "line-ns-open", "line": {"width": 2, "color": colour}},
                hovertext=[_esc(f"rank {e.rank} {e.text}"[:400]) for e in events],
                hoverinfo="x+text",
            )
        )
    counts = [f"{lane} ({len(data.lanes[lane])})" for lane in lanes]
    fig.update_yaxes(
        tickvals=list(range(len(lanes))),
        ticktext=counts,
        range=[len(lanes) - 0.5, -0.5],
        showgrid=True,
        zeroline=False,
    )
    fig.update_layout(title="receipts by kind (hover for the numbers)", xaxis_title=X_TITLE)
    mark(fig, data)
    notes = "".join(
        f'<p class="warn">{_esc(lane)}: {n} more event(s) not drawn</p>'
        for lane, n in data.left_out.items()
    )
    return head + _figure_html(fig, "fig-timeline", height=120 + 30 * len(lanes)) + notes


def queue_section(data: ReportData) -> str:
    head = '<h2 id="queue">Queue depth</h2>'
    if not keys_with(data, QUEUE_SERIES):
        return head + _nodata(f"{_NO_ITERATIONS}, and no other receipt carries the queue's counts")
    return head + _figure_html(queue_figure(data), "fig-queue")


def progress_section(data: ReportData) -> str:
    head = '<h2 id="progress">Progress and stalls</h2>'
    if not keys_with(data, PROGRESS_SERIES):
        why = "no iteration receipt with the progress counters (" + ", ".join(PROGRESS_SERIES)
        return head + _nodata(why + ")") + _stall_table(data)
    return head + _figure_html(progress_figure(data), "fig-progress") + _stall_table(data)


def _stall_table(data: ReportData) -> str:
    """The scheduler's stalls (shaded on every time figure), with their numbers."""
    if not data.stalls:
        return '<p class="meta">no scheduler.stall or scheduler.resume receipt</p>'
    rows = [
        [
            f"{data.rel(s.since):.3f}",
            f"{data.rel(s.until):.3f}",
            _esc(data.label(s.key)),
            "?" if s.stalled_s is None else f"{s.stalled_s:.3f}",
            _esc(s.text),
        ]
        for s in data.stalls
    ]
    return _table(["from +s", "to +s", "rank", "stood (s)", "what it held"], rows)


def latency_section(data: ReportData) -> str:
    head = '<h2 id="latency">Per-request latency (request.finish)</h2>'
    lat = data.latency
    if not lat.get("ttft_s") and not lat.get("e2e_s"):
        return head + _nodata("no request.finish receipt with ttft_s or e2e_s")
    rows = []
    for name, values in lat.items():
        if values:
            cells = [percentile(values, q) for q in (50, 90, 99)] + [max(values)]
            rows.append([_esc(name), str(len(values)), *(f"{v:.3f}" for v in cells)])
    table = _table(["latency", "requests", "p50 (s)", "p90 (s)", "p99 (s)", "max (s)"], rows, 1)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT (s)", "E2E (s)"))
    for col, name in ((1, "ttft_s"), (2, "e2e_s")):
        fig.add_trace(
            go.Histogram(x=lat.get(name, []), name=name, nbinsx=40, showlegend=False), 1, col
        )
        fig.update_xaxes(title_text="seconds", row=1, col=col)
    fig.update_yaxes(title_text="requests", row=1, col=1)
    return head + table + _figure_html(fig, "fig-latency", height=340)


def ranks_section(data: ReportData) -> str:
    parts = ['<h2 id="ranks">Ranks and cutovers</h2>']
    by_kind = data.kinds_by_rank()
    ranks = sorted(data.stats.ranks)
    if by_kind:
        rows = [[_esc(k), *(str(per.get(r, 0)) for r in ranks)] for k, per in by_kind.items()]
        parts.append(_table(["receipts of kind", *(f"rank {r}" for r in ranks)], rows, 1))
    else:
        parts.append(_nodata("no receipts"))
    if data.floors:
        fig = go.Figure()
        for rank, series in sorted(data.floors.items()):
            x = [data.rel(t) for t, _, _ in series]
            fig.add_trace(go.Scatter(x=x, y=[f for _, f, _ in series], name=f"rank {rank} floor"))
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[v for _, _, v in series],
                    name=f"rank {rank} local",
                    line={"dash": "dot"},
                )
            )
        fig.update_layout(title="published floor vs local room (group.floor)", xaxis_title=X_TITLE)
        parts.append(_figure_html(fig, "fig-floors"))
    elif len(ranks) > 1:
        parts.append(_nodata("no group.floor receipt: no rank published a floor"))
    cut = [m for m in data.markers if m.kind in CUTOVER_KINDS]
    if cut:
        rows = [[f"{data.rel(m.t):.3f}", str(m.rank), _esc(m.text)] for m in cut]
        parts.append(_table(["+s", "rank", "cutover"], rows))
    else:
        known = ", ".join(CUTOVER_KINDS) or "none in this schema"
        parts.append(_nodata(f"no cutover receipt in these logs (cutover kinds: {known})"))
    return "\n".join(parts)


def _header(data: ReportData, report: Report) -> str:
    st = data.stats
    start = (
        datetime.fromtimestamp(data.t0, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if data.t0 is not None
        else "no receipt"
    )
    logs = ", ".join(_esc(p) for p in report.logs)
    lines = [
        "<h1>Attest audit report</h1>",
        f'<p class="meta">logs: {logs}<br>first receipt: {start}; ranks: '
        f"{_esc(sorted(st.ranks)) if st.ranks else 'none'}; read {st.files} file(s), "
        f"{st.lines} lines: {st.receipts} receipts, {st.text} text, {st.garbage} garbage, "
        f"{st.truncated} truncated, {st.malformed} malformed</p>",
    ]
    incomplete = st.incomplete()
    if incomplete:
        lines.append(
            f'<p class="warn">incomplete ({_esc(incomplete[0])}): {_esc(incomplete[1])}</p>'
        )
    nav = " · ".join(
        f'<a href="#{a}">{t}</a>'
        for a, t in (
            ("verdicts", "verdicts"),
            ("pool", "pool"),
            ("timeline", "timeline"),
            ("queue", "queue"),
            ("progress", "progress"),
            ("latency", "latency"),
            ("ranks", "ranks"),
        )
    )
    return "\n".join(lines) + f"<p>{nav}</p>"


def render(data: ReportData, report: Report) -> str:
    """The whole page: plotly's JavaScript inline once, then every section."""
    body = "\n".join(
        (
            _header(data, report),
            verdict_section(report),
            pool_section(data),
            timeline_section(data),
            queue_section(data),
            progress_section(data),
            latency_section(data),
            ranks_section(data),
        )
    )
    title = f"audit report: {report.status.value}"
    js = plotly.offline.get_plotlyjs()
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">{js}</script></head>\n<body>\n{body}\n</body></html>\n'
    )
