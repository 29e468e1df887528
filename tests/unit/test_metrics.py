"""/metrics reads the scheduler's PoolSnapshot: each gauge and decision counter is a field of
the one snapshot, under the metric names operators already scrape."""

from __future__ import annotations

from engine.observability import metrics as metrics_mod
from engine.observability import schema
from engine.observability.metrics import ServerMetrics
from engine.observability.receipts import Receipts
from engine.request.messages import PoolSnapshot, SpecCounts


def _samples(metrics: ServerMetrics) -> dict[str, float]:
    out = {}
    for line in metrics.render().decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_gauges_and_counters_come_from_the_latest_snapshot():
    snaps = [PoolSnapshot()]
    m = ServerMetrics(lambda: snaps[-1])
    idle = _samples(m)
    assert idle["attest:kv_usage_ratio"] == 0.0  # an empty pool divides by nothing
    assert idle["attest:parks_total"] == 0.0
    snaps.append(
        PoolSnapshot(
            running=3,
            parked=1,
            waiting=2,
            kv_used=30,
            kv_cached=20,
            kv_evictable=12,
            kv_free=50,
            kv_total=100,
            receipts={
                schema.ADMISSION_PARK: 4,
                schema.REQUEUE: 1,
                schema.EVICTION: 7,
                schema.EVICTION_UNDER_DELIVERED: 2,
                schema.INVARIANT_VIOLATION: 1,
            },
            receipts_written={schema.ADMISSION_PARK: 3, schema.REQUEUE: 1, schema.EVICTION: 7},
            receipts_failed={schema.ADMISSION_PARK: 1},
        )
    )
    s = _samples(m)  # read at scrape time: the new snapshot, not the one at construction
    assert s["attest:num_requests_running"] == 3
    assert s["attest:num_requests_parked"] == 1
    assert s["attest:num_requests_waiting"] == 2
    assert s["attest:kv_usage_ratio"] == 0.3
    assert {k: v for k, v in s.items() if k.startswith("attest:kv_tokens{")} == {
        'attest:kv_tokens{state="used"}': 30,
        'attest:kv_tokens{state="cached"}': 20,
        'attest:kv_tokens{state="evictable"}': 12,
        'attest:kv_tokens{state="free"}': 50,
        'attest:kv_tokens{state="total"}': 100,
    }
    assert s["attest:parks_total"] == 4 and s["attest:retractions_total"] == 1
    assert s["attest:evictions_total"] == 7 and s["attest:oom_total"] == 0
    assert idle["attest:eviction_under_delivered_total"] == 0
    assert idle["attest:invariant_violations_total"] == 0
    assert s["attest:eviction_under_delivered_total"] == 2
    assert s["attest:invariant_violations_total"] == 1
    # a park whose receipt the log could not take is a park still: counted apart, not lost
    assert s[f'attest:receipts_total{{kind="{schema.ADMISSION_PARK}"}}'] == 3
    assert s[f'attest:receipts_failed_total{{kind="{schema.ADMISSION_PARK}"}}'] == 1
    assert not any(k.startswith("attest:receipts_failed_total") for k in idle)


def test_speculation_counters_under_vllms_names_only_when_it_is_on():
    assert not any("spec_decode" in k for k in _samples(ServerMetrics(PoolSnapshot)))
    spec = SpecCounts(drafts=5, draft_tokens=18, accepted_tokens=9, accepted_per_pos=(4, 3, 2, 0))
    s = _samples(ServerMetrics(lambda: PoolSnapshot(spec=spec)))
    assert s["attest:spec_decode_num_drafts_total"] == 5
    assert s["attest:spec_decode_num_draft_tokens_total"] == 18
    assert s["attest:spec_decode_num_accepted_tokens_total"] == 9
    per_pos = {k: v for k, v in s.items() if "per_pos" in k}
    assert per_pos == {
        f'attest:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}': v
        for i, v in enumerate((4, 3, 2, 0))
    }


def test_outcome_counters_read_the_receipts_by_what_they_said():
    """A rung that raised, a refused grammar, a quarantined file, a load that failed: each a
    series of its own, read from the receipts the scheduler counted; every value of the closed
    list is there from the start at 0, so the first one counted is an increase."""
    r = Receipts()
    r.emit(schema.RELIEF_RUNG, rung="evict", asked=4, paid=4, outcome="paid", error=None)
    r.emit(schema.RELIEF_RUNG, rung="spill", asked=4, paid=0, outcome="raised", error="E: x")
    r.emit(schema.GRAMMAR_COMPILE, guide="g", kind="regex", cache="miss", outcome="invalid")
    r.emit(schema.STORE_QUARANTINE, path="p", reason="checksum", detail="d")
    r.emit(schema.STORE_LOAD, pages=0, asked=2, tokens=0, bytes=0, error="checksum")
    r.emit(schema.STORE_LOAD, pages=2, asked=2, tokens=32, bytes=64)
    r.emit(schema.STORE_WRITE, reason="evict", pages=0, tokens=0, allocated=0, apparent=0)
    s = _samples(ServerMetrics(lambda: PoolSnapshot(tallies=dict(r.tallies))))
    assert s['attest:relief_rungs_total{outcome="raised"}'] == 1
    assert s['attest:relief_rungs_total{outcome="paid"}'] == 1
    assert s['attest:relief_rungs_total{outcome="short"}'] == 0
    assert s['attest:grammar_compiles_total{outcome="invalid"}'] == 1
    assert s['attest:grammar_compiles_total{outcome="timeout"}'] == 0
    assert s['attest:kv_store_quarantines_total{reason="checksum"}'] == 1
    assert s['attest:kv_store_quarantines_total{reason="unreadable"}'] == 0
    assert s['attest:kv_store_loads_total{outcome="error"}'] == 1
    assert s['attest:kv_store_loads_total{outcome="ok"}'] == 1
    assert s['attest:kv_store_writes_total{outcome="ok"}'] == 1
    assert s['attest:kv_store_writes_total{outcome="error"}'] == 0
    idle = _samples(ServerMetrics(PoolSnapshot))
    assert idle['attest:relief_rungs_total{outcome="raised"}'] == 0


def test_the_scheduler_process_is_up_and_its_heartbeat_has_an_age():
    state = [(True, 0.25)]
    m = ServerMetrics(PoolSnapshot, scheduler=lambda: state[-1])
    s = _samples(m)
    assert s["attest:scheduler_up"] == 1 and s["attest:scheduler_heartbeat_age_seconds"] == 0.25
    state.append((False, 12.5))
    s = _samples(m)
    assert s["attest:scheduler_up"] == 0 and s["attest:scheduler_heartbeat_age_seconds"] == 12.5


def test_genai_histograms_take_the_same_timings_as_attests_own(monkeypatch):
    """One measurement, two names: the GenAI server histograms (OpenTelemetry's names, in
    Prometheus form) observe the very values attest's histograms do, per the conventions'
    definitions: TTFT and time per output token for successful responses only, the duration
    of every request with its error type when it failed."""
    clock = iter([int(t * 1e9) for t in (1.5, 2, 3, 4, 4.5, 5)])
    monkeypatch.setattr(metrics_mod.time, "time_ns", lambda: next(clock))
    m = ServerMetrics(PoolSnapshot, model="tiny")
    t = m.timer(5, 1_000_000_000, api="chat.completions")
    t.tokens(1)  # first token at 1.5 s: TTFT 0.5 s
    t.tokens(1)  # 2.0 s
    t.tokens(2)  # 3.0 s: two tokens in the step
    t.end("stop")  # 4.0 s: duration 3.0 s; 3 tokens after the first over 1.5 s: 0.5 s each
    failed = m.timer(5, 1_000_000_000, api="completions")
    failed.tokens(1)  # 4.5 s: a first token, then the client went away
    failed.end("abort")  # 5.0 s
    s = _samples(m)
    lab = 'gen_ai_operation_name="chat",gen_ai_provider_name="attest",gen_ai_request_model="tiny"'
    assert s[f"gen_ai_server_time_to_first_token_seconds_sum{{{lab}}}"] == 0.5
    # attest's own counts every first token: the aborted request's (3.5 s) too
    assert s["attest:time_to_first_token_seconds_sum"] == 4.0
    assert s[f"gen_ai_server_time_per_output_token_seconds_sum{{{lab}}}"] == 0.5
    assert s[f"gen_ai_server_time_per_output_token_seconds_count{{{lab}}}"] == 1
    assert s[f'gen_ai_server_request_duration_seconds_sum{{error_type="",{lab}}}'] == 3.0
    assert s["attest:e2e_request_latency_seconds_sum"] == 7.0  # 3.0 s + the aborted 4.0 s
    bad = lab.replace('"chat"', '"text_completion"')
    assert s[f'gen_ai_server_request_duration_seconds_sum{{error_type="abort",{bad}}}'] == 4.0
    assert f"gen_ai_server_time_to_first_token_seconds_count{{{bad}}}" not in s
    # the conventions' advised buckets
    assert f'gen_ai_server_time_to_first_token_seconds_bucket{{{lab},le="0.001"}}' in s
    assert f'gen_ai_server_time_per_output_token_seconds_bucket{{{lab},le="2.5"}}' in s
    assert f'gen_ai_server_request_duration_seconds_bucket{{error_type="",{lab},le="81.92"}}' in s
