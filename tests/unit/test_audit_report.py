"""`audit report`'s data (one pass over the logs) and its page (self-contained HTML)."""

from __future__ import annotations

import re

import pytest

from audit import report_data
from audit.report import render
from audit.report_data import collect, percentile
from audit.report_time import pool_figure, progress_figure, queue_figure
from audit.spec import load_spec, shipped
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText
from tests.unit.report_logs import CAPACITY, FIGURES, REQUESTS, busy_log, quiet_log, sparse_boot_log

KEY = ("b-00000001", 0)


@pytest.fixture
def busy(tmp_path):
    return busy_log(tmp_path / "busy.jsonl")


def page(logs) -> str:
    specs = [load_spec(p) for p in shipped()]
    return render(collect(logs), evaluate(specs, logs, only_applicable=True))


# -- data -------------------------------------------------------------------------------------


def test_the_pool_layers_add_up_to_the_whole_page_capacity_on_every_rank(busy):
    d = collect([busy])
    assert sorted(d.pool) == [("b-00000001", 0), ("b-00000001", 1)]
    # kv_tokens is 1027 with pages of 4: the allocator holds whole pages only
    assert set(d.capacity.values()) == {CAPACITY}
    for samples in d.pool.values():
        assert len(samples) == 60
        for s in samples:
            assert s.used + s.cached_held + s.evictable + s.staged + s.free == CAPACITY
            assert s.used >= 0 and s.cached_held >= 0
        assert [s.t for s in samples] == sorted(s.t for s in samples)


def test_without_boot_pool_sized_the_used_layer_is_unknown_not_guessed(tmp_path):
    log = LogText().ready()
    log.r("iteration", running=1, waiting=0, avail=10, cached=4, evictable=1, staged=0)
    d = collect([log.write(tmp_path / "l.jsonl")])
    (s,) = next(iter(d.pool.values()))
    assert (s.used, s.free, s.cached_held, s.evictable) == (None, 10, 3, 1)
    html = render(d, evaluate([], [tmp_path / "l.jsonl"]))
    assert "no boot.pool_sized receipt" in html
    assert "used (private to requests)" not in html  # the layer is left out, not drawn as 0


def test_pressure_events_land_in_their_lanes_with_their_numbers(busy):
    d = collect([busy])
    count = {lane: len(ev) for lane, ev in d.lanes.items()}
    assert count["park"] == count["unpark"] == count["retract"] == count["eviction"] == 2
    assert count["relief rung"] == 6 and count["relief engage"] == 2
    assert count["allocation net"] == 4  # a flush and a retry per rank
    assert count["alloc.oom"] == count["abort / reject"] == 0  # empty lanes are still lanes
    retract = d.lanes["retract"][0]
    assert "rids=['r0-11']" in retract.text and "tokens_freed=60" in retract.text
    assert d.lanes["park"][0].text.startswith("admission.park: rid=r0-10 ")
    raised = [e.text for e in d.lanes["relief rung"] if "outcome=raised" in e.text]
    assert len(raised) == 2 and all("rung=spill" in t for t in raised)


def test_latencies_come_from_every_finished_request(busy):
    d = collect([busy])
    assert len(d.latency["ttft_s"]) == len(d.latency["e2e_s"]) == 2 * REQUESTS
    assert max(d.latency["ttft_s"]) == pytest.approx(0.05 * REQUESTS)
    assert min(d.latency["e2e_s"]) == pytest.approx(0.5)


def test_nearest_rank_percentiles():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 11)], 90) == 9.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([7.0], 99) == 7.0


def test_time_starts_at_the_earliest_receipt_whatever_order_the_logs_come_in(tmp_path):
    early = LogText("b-0000000a").ready().write(tmp_path / "a.jsonl")
    late = LogText("b-0000000b")
    late.ts = 5000.0
    late.ready().r("iteration", running=0, waiting=0, avail=1)
    d = collect([late.write(tmp_path / "b.jsonl"), early])
    assert d.t0 == pytest.approx(1000.01)
    assert d.rel(d.pool[("b-0000000b", 0)][0].t) == pytest.approx(4000.02)
    assert d.label(("b-0000000b", 0)) == "b-0000000b rank 0"  # two boots: the boot is named
    assert [m.kind for m in d.markers] == ["boot.start", "boot.start"]


def test_floors_and_markers_per_rank(busy):
    d = collect([busy])
    assert sorted(d.floors) == [0, 1]
    assert d.floors[1][0][1:] == (200, 230)
    assert sorted(m.kind for m in d.markers) == ["boot.start"] * 2 + ["boot.stop"] * 2


def test_a_lane_over_its_cap_keeps_its_first_events_and_counts_the_rest(busy, monkeypatch):
    monkeypatch.setattr(report_data, "MAX_EVENTS_PER_LANE", 1)
    d = collect([busy])
    assert len(d.lanes["relief rung"]) == 1 and d.left_out["relief rung"] == 5
    html = render(d, evaluate([], [busy]))
    assert "relief rung: 5 more event(s) not drawn" in html


# -- between the sampled iterations -----------------------------------------------------------


def early(d, name: str, before: float = 23.0) -> list[tuple[float, int, str]]:
    """The points of ``name`` on rank 0 before ``before`` seconds: (+s, value, receipt kind)."""
    pts = d.series[KEY].get(name, [])
    return [(round(d.rel(p.t), 2), p.value, p.kind) for p in pts if d.rel(p.t) < before]


def test_a_sparse_40s_boot_has_points_for_its_first_seconds_from_the_other_receipts(tmp_path):
    d = collect([sparse_boot_log(tmp_path / "sparse.jsonl")])
    assert [round(d.rel(s.t), 2) for s in d.pool[KEY]] == [23.0, 28.0, 33.0, 38.0]  # stacked
    assert early(d, "evictable") == [
        (1.0, 0, "admission.admit"),
        (2.0, 32, "admission.admit"),
        (3.0, 48, "admission.defer"),
        (4.0, 48, "admission.defer"),
        (14.0, 0, "retract"),
        (16.0, 0, "eviction"),
    ]
    # admission's local_avail is its budget term (less this step's decode slots), not free
    assert early(d, "free") == [(14.0, 16, "retract"), (16.0, 96, "eviction")]
    # the stall's numbers are the work held from its `since`; a defer naming a rid counts its
    # in-flight chunk, not the line
    assert early(d, "waiting") == [
        (3.0, 4, "admission.defer"),
        (5.0, 4, "scheduler.stall"),
        (15.0, 5, "relief.throttle"),
    ]
    # the `running` of a defer or the throttle counts parked requests in: not the series
    assert early(d, "running") == [(5.0, 2, "scheduler.stall")]
    assert early(d, "parked") == [(5.0, 1, "scheduler.stall")]
    assert early(d, "staged") == early(d, "cached") == []  # nothing that early carries them
    assert [p.value for p in d.series[KEY]["cached"]] == [128] * 4


def test_the_time_figures_draw_the_first_seconds(tmp_path):
    log = sparse_boot_log(tmp_path / "sparse.jsonl")
    d = collect([log])

    def first_x(fig) -> float:
        return min(x for trace in fig.data for x in trace.x)

    assert first_x(pool_figure(d, KEY)) == pytest.approx(1.0)
    assert first_x(queue_figure(d)) == pytest.approx(3.0)
    assert first_x(progress_figure(d)) == pytest.approx(23.0)
    html = page([log])
    for anchor in ("pool", "queue", "progress"):
        assert f'<h2 id="{anchor}">' in html


def test_rank_local_pool_numbers_count_on_a_boot_of_one_rank_only(tmp_path):
    one = collect([sparse_boot_log(tmp_path / "one.jsonl")])
    two = collect([sparse_boot_log(tmp_path / "two.jsonl", tp=2)])  # rank 0's log alone
    assert {p.kind for p in one.series[KEY]["free"]} == {"retract", "eviction", "iteration"}
    assert {p.kind for p in two.series[KEY]["free"]} == {"retract", "iteration"}
    log = LogText().ready()
    log.r(
        "eviction",
        reason="load",
        asked=8,
        evicted=8,
        staged=0,
        evictable_before=8,
        evictable_after=4,
        available_after=20,
        scope="host_backed",
    )
    log.r("alloc.oom", need=64, available=3, staged=5, evictable=0, capacity=64, site="decode")
    d = collect([log.write(tmp_path / "tier.jsonl")])
    got = {name: [(p.value, p.kind) for p in pts] for name, pts in d.series[KEY].items()}
    # host_backed: evictable_after is what such a pass can reach, not the pool's evictable
    assert got == {
        "free": [(20, "eviction"), (3, "alloc.oom")],
        "staged": [(5, "alloc.oom")],
        "evictable": [(0, "alloc.oom")],
    }


def test_stalls_are_spans_from_since_to_the_resume_on_every_time_figure(tmp_path):
    d = collect([sparse_boot_log(tmp_path / "sparse.jsonl")])
    spans = [(round(d.rel(s.since), 2), round(d.rel(s.until), 2), s.stalled_s) for s in d.stalls]
    assert spans == [(5.0, 12.02, 7.0), (38.5, 39.5, None)]  # the last one never resumed
    assert "held 2 running, 4 waiting, 1 parked; 1 arrived" in d.stalls[0].text
    for fig in (pool_figure(d, KEY), queue_figure(d), progress_figure(d)):
        rects = [(round(r.x0, 2), round(r.x1, 2)) for r in fig.layout.shapes if r.type == "rect"]
        assert rects == [(a, b) for a, b, _ in spans]
    log = LogText().ready()
    log.r("scheduler.resume", ts=1010.0, stalled_s=4.0, arrived=0)  # its stall line was lost
    (alone,) = collect([log.write(tmp_path / "alone.jsonl")]).stalls
    assert (alone.since, alone.until, alone.stalled_s) == (1006.0, 1010.0, 4.0)


def test_progress_counters_come_from_iterations_over_time(tmp_path):
    d = collect([sparse_boot_log(tmp_path / "sparse.jsonl")])
    got = {
        name: [(round(d.rel(p.t)), p.value) for p in d.series[KEY][name]]
        for name in ("tokens_generated", "admissions", "requests_ended")
    }
    assert got == {
        "tokens_generated": [(23, 40), (28, 80), (33, 120), (38, 160)],
        "admissions": [(23, 3), (28, 4), (33, 5), (38, 6)],
        "requests_ended": [(23, 0), (28, 1), (33, 2), (38, 3)],
    }
    fig = progress_figure(d)
    assert sorted(t.name for t in fig.data) == [
        "rank 0 admissions",
        "rank 0 requests_ended",
        "rank 0 tokens_generated",
    ]
    log = LogText().ready()
    log.r("iteration", running=1, waiting=0, avail=10)  # an engine that predates the counters
    old = collect([log.write(tmp_path / "old.jsonl")])
    assert "tokens_generated" not in old.series[KEY]  # never a zero it did not write
    html = render(old, evaluate([], [tmp_path / "old.jsonl"]))
    assert "no data: no iteration receipt with the progress counters" in html


# -- the page ---------------------------------------------------------------------------------


def test_the_page_has_every_section_its_verdicts_and_fetches_nothing(busy):
    html = page([busy])
    for anchor in ("verdicts", "pool", "timeline", "queue", "progress", "latency", "ranks"):
        assert f'<h2 id="{anchor}">' in html
    figures = re.findall(r'<div id="(fig-[a-z0-9-]+)" class="plotly-graph-div"', html)
    assert figures == FIGURES
    # every figure id is unique in the page (a heading with a figure's id hides the figure)
    for f in figures:
        assert html.count(f'id="{f}"') == 1
    assert "every_request_ends" in html and 'class="verdict PASS"' in html
    # self-contained: plotly's JavaScript inline once, no script, style or image from elsewhere
    assert html.count("Plotly.newPlot") >= len(figures)
    assert len(re.findall(r"<script[^>]*>", html)) == 1 + len(figures)
    assert not re.search(r"<script[^>]+src=|<link|<img|@import", html)
    assert "no cutover receipt in these logs" in html


def test_a_log_with_no_iteration_receipts_still_makes_a_report_saying_no_data(tmp_path):
    html = page([quiet_log(tmp_path / "quiet.jsonl")])
    assert html.count("no data: no iteration receipts in these logs") == 2  # pool and queue
    assert "no data: no iteration receipt with the progress counters" in html
    assert "no data: no park, retraction, eviction" in html
    assert "no data: no request.finish receipt" in html
    assert "plotly-graph-div" not in html
    assert '<h2 id="verdicts">' in html and "boot.ready" in html


def test_text_from_the_logs_is_escaped_in_the_page(tmp_path):
    bad = "</script><script>alert(1)</script>"
    log = LogText().ready().received(bad).park(bad)
    html = page([log.write(tmp_path / "l.jsonl")])
    assert "<script>alert(1)" not in html
