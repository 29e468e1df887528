"""`audit report`'s figures over time: the KV pool's layers and the queue, with boots, stops and
cutovers marked (plotly figures; the page around them is `audit/report.py`)."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from audit.report_data import Key, ReportData

X_TITLE = "seconds since the first receipt"
_LAYERS = (  # (field, legend, colour), bottom to top: the stack adds up to the capacity
    ("used", "used (private to requests)", "#d62728"),
    ("cached_held", "cached, held by requests", "#ff7f0e"),
    ("evictable", "cached, evictable", "#bcbd22"),
    ("staged", "staged frees", "#9467bd"),
    ("free", "free", "#2ca02c"),
)


def mark(fig: go.Figure, data: ReportData) -> None:
    """Boots, stops and cutovers as dotted vertical lines on a time figure."""
    for m in data.markers:
        fig.add_vline(x=data.rel(m.t), line={"dash": "dot", "color": "#888", "width": 1})
        fig.add_annotation(
            x=data.rel(m.t), y=1, yref="paper", text=html.escape(f"{m.kind} r{m.rank}"),
            showarrow=False, textangle=-90, xanchor="right", yanchor="top",
            font={"size": 9, "color": "#666"},
        )  # fmt: skip


def pool_figure(data: ReportData, key: Key) -> go.Figure:
    samples = data.pool[key]
    x = [data.rel(s.t) for s in samples]
    fig = go.Figure()
    for name, legend, colour in _LAYERS:
        y = [getattr(s, name) for s in samples]
        if any(v is None for v in y):
            continue  # "used" needs the pool's size
        fig.add_trace(
            go.Scatter(
                x=x, y=y, name=legend, mode="lines", stackgroup="pool",
                line={"width": 0.5, "color": colour}, fillcolor=colour,
            )
        )  # fmt: skip
    cap = data.capacity.get(key)
    if cap is not None:
        fig.add_hline(y=cap, line={"dash": "dash", "color": "#333", "width": 1})
    title = f"{data.label(key)}: KV pool (tokens)" + (f", capacity {cap}" if cap else "")
    fig.update_layout(title=title, xaxis_title=X_TITLE, yaxis_title="tokens", hovermode="x unified")
    mark(fig, data)
    return fig


def queue_figure(data: ReportData) -> go.Figure:
    fig = go.Figure()
    for key in sorted(data.pool):
        samples = data.pool[key]
        x = [data.rel(s.t) for s in samples]
        for name, dash in (("waiting", "solid"), ("running", "dash"), ("parked", "dot")):
            fig.add_trace(
                go.Scatter(
                    x=x, y=[getattr(s, name) for s in samples], mode="lines",
                    name=f"{data.label(key)} {name}", line={"dash": dash, "shape": "hv"},
                )
            )  # fmt: skip
    fig.update_layout(
        title="requests waiting, running and parked (iteration receipts)", xaxis_title=X_TITLE,
        yaxis_title="requests", hovermode="x unified",
    )  # fmt: skip
    mark(fig, data)
    return fig
