"""`audit report`'s figures over time: the KV pool's layers, the queue and the progress counters,
with boots, stops and cutovers marked and the scheduler's stalls shaded (plotly figures; the
page around them is `audit/report.py`).

Each point drawn is a number a receipt carried (`audit/report_series.py` says which receipts
speak for which series); a line joins a series' points, a marker shows where each one is, and
its hover names the receipt kind that carried it.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from audit.report_data import Key, ReportData
from audit.report_series import POOL_SERIES, PROGRESS_SERIES, QUEUE_SERIES, Point

X_TITLE = "seconds since the first receipt"
_LAYERS = (  # (field, legend, colour), bottom to top: the stack adds up to the capacity
    ("used", "used (private to requests)", "#d62728"),
    ("cached_held", "cached, held by requests", "#ff7f0e"),
    ("evictable", "cached, evictable", "#bcbd22"),
    ("staged", "staged frees", "#9467bd"),
    ("free", "free", "#2ca02c"),
)
# the per-layer lines: each layer's colour in the stack ("cached": held and evictable together)
_LINES = {"free": "#2ca02c", "evictable": "#bcbd22", "staged": "#9467bd", "cached": "#ff7f0e"}
_QUEUE_DASH = {"waiting": "solid", "running": "dash", "parked": "dot"}
_STALL = "#c62828"


def keys_with(data: ReportData, names: tuple[str, ...]) -> list[Key]:
    """The (boot, rank)s with a point in any of the series ``names``."""
    return sorted(k for k, by in data.series.items() if any(by.get(n) for n in names))


def mark(fig: go.Figure, data: ReportData) -> None:
    """Boots, stops and cutovers as dotted vertical lines on a time figure; the scheduler's
    stalls as shaded spans, from the last turn to the turn after it."""
    for m in data.markers:
        fig.add_vline(x=data.rel(m.t), line={"dash": "dot", "color": "#888", "width": 1})
        fig.add_annotation(
            x=data.rel(m.t),
            y=1,
            yref="paper",
            text=html.escape(f"{m.kind} r{m.rank}"),
            showarrow=False,
            textangle=-90,
            xanchor="right",
            yanchor="top",
            font={"size": 9, "color": "#666"},
        )
    for s in data.stalls:
        x0, x1 = data.rel(s.since), data.rel(s.until)
        fig.add_shape(
            type="rect",
            xref="x",
            yref="paper",
            x0=x0,
            x1=x1,
            y0=0,
            y1=1,
            layer="below",
            fillcolor=_STALL,
            opacity=0.12,
            line={"width": 0},
        )
        length = "?" if s.stalled_s is None else f"{s.stalled_s:.1f}"
        fig.add_annotation(
            x=x0,
            y=0,
            yref="paper",
            text=html.escape(f"stall r{s.key[1]} {length} s"),
            hovertext=html.escape(s.text),
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            font={"size": 9, "color": _STALL},
        )


def _line(data: ReportData, pts: list[Point], name: str, **style: object) -> go.Scatter:
    return go.Scatter(
        x=[data.rel(p.t) for p in pts],
        y=[p.value for p in pts],
        name=name,
        mode="lines+markers",
        marker={"size": 5},
        hovertext=[p.kind for p in pts],
        hoverinfo="x+y+name+text",
        **style,
    )


def pool_figure(data: ReportData, key: Key) -> go.Figure:
    """Above: the layers stacked to the capacity, from iterations (every layer at one moment).
    Below: each layer from every receipt that carries it."""
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        row_heights=[0.6, 0.4],
        subplot_titles=("stacked (iteration receipts)", "each layer from every receipt"),
    )
    samples = data.pool.get(key, [])
    x = [data.rel(s.t) for s in samples]
    for name, legend, colour in _LAYERS:
        y = [getattr(s, name) for s in samples]
        if not samples or any(v is None for v in y):
            continue  # "used" needs the pool's size
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                name=legend,
                mode="lines",
                stackgroup="pool",
                legendgroup="stack",
                line={"width": 0.5, "color": colour},
                fillcolor=colour,
            ),
            1,
            1,
        )
    by = data.series.get(key, {})
    for name in POOL_SERIES:
        if by.get(name):
            style = {"line": {"color": _LINES[name], "shape": "hv"}, "legendgroup": "each"}
            fig.add_trace(_line(data, by[name], f"{name} (each receipt)", **style), 2, 1)
    cap = data.capacity.get(key)
    if cap is not None:
        fig.add_hline(y=cap, line={"dash": "dash", "color": "#333", "width": 1}, row=1, col=1)
    title = f"{data.label(key)}: KV pool (tokens)" + (f", capacity {cap}" if cap else "")
    fig.update_layout(title=title, hovermode="x unified")
    fig.update_xaxes(title_text=X_TITLE, row=2, col=1)
    fig.update_yaxes(title_text="tokens")
    mark(fig, data)
    return fig


def queue_figure(data: ReportData) -> go.Figure:
    fig = go.Figure()
    for key in keys_with(data, QUEUE_SERIES):
        by = data.series[key]
        for name in QUEUE_SERIES:
            if by.get(name):
                style = {"line": {"dash": _QUEUE_DASH[name], "shape": "hv"}}
                fig.add_trace(_line(data, by[name], f"{data.label(key)} {name}", **style))
    fig.update_layout(
        title="requests waiting, running and parked (iterations, and the receipts between "
        "them that carry the counts)",
        xaxis_title=X_TITLE,
        yaxis_title="requests",
        hovermode="x unified",
    )
    mark(fig, data)
    return fig


def progress_figure(data: ReportData) -> go.Figure:
    """The iterations' progress counters, cumulative since boot: tokens on the left axis,
    admissions and requests ended on the right."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for key in keys_with(data, PROGRESS_SERIES):
        by = data.series[key]
        for name in PROGRESS_SERIES:
            if by.get(name):
                right = name != "tokens_generated"
                trace = _line(data, by[name], f"{data.label(key)} {name}")
                fig.add_trace(trace, secondary_y=right)
    fig.update_layout(
        title="progress since boot (iteration receipts): a flat stretch is no progress",
        xaxis_title=X_TITLE,
        hovermode="x unified",
    )
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="tokens generated", secondary_y=False)
    fig.update_yaxes(title_text="admissions, requests ended", secondary_y=True)
    mark(fig, data)
    return fig
