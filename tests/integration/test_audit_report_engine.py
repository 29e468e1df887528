"""`audit report`'s data on a boot log the real engine wrote under pressure (tiny model): the pool
layers it derives from `iteration` receipts and `boot.pool_sized` add up to the pool, with no
layer negative, so the picture keeps the engine's ledger (law 7); every finished request has its
latencies; the pressure the engine reports lands on the timeline; the receipts between the
sampled iterations add points with numbers inside the pool."""

from __future__ import annotations

import orjson

from audit.report import render
from audit.report_data import collect
from audit.verdict import evaluate
from tests.integration.test_audit_engine import pressured_log


def test_the_report_of_a_pressured_engine_keeps_its_ledger(tiny_model_dir, tmp_path):
    log = tmp_path / "boot.jsonl"
    pressured_log(tiny_model_dir, log, n=24)
    recs = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    finished = [r for r in recs if r["event"] == "request.finish"]
    (sized,) = [r for r in recs if r["event"] == "boot.pool_sized"]

    d = collect([log])

    ((key, samples),) = d.pool.items()
    cap = d.capacity[key]
    assert cap == sized["kv_tokens"] // sized["page_size"] * sized["page_size"]
    assert len(samples) == sum(r["event"] == "iteration" for r in recs) > 3
    for s in samples:
        layers = (s.used, s.cached_held, s.evictable, s.staged, s.free)
        assert min(layers) >= 0, s
        assert sum(layers) == cap, s
    assert max(s.used for s in samples) > 0 and max(s.waiting for s in samples) > 0
    # the receipts between the sampled iterations speak too, with numbers inside the pool
    series = d.series[key]
    assert min(p.t for p in series["evictable"]) < samples[0].t  # admissions before it
    assert {p.kind for p in series["free"]} > {"iteration"}
    for name in ("free", "evictable", "staged", "cached"):
        assert all(0 <= p.value <= cap for p in series[name]), name
    assert len(d.latency["ttft_s"]) == len(d.latency["e2e_s"]) == len(finished) == 24
    assert all(0 <= t <= e for t, e in zip(d.latency["ttft_s"], d.latency["e2e_s"]))
    assert d.lanes["eviction"] and d.lanes["park"]  # the pressure engaged, and is drawn
    assert "plotly-graph-div" in render(d, evaluate([], [log]))
