"""/metrics reads the scheduler's PoolSnapshot: each gauge and decision counter is a field of
the one snapshot, under the metric names operators already scrape."""

from __future__ import annotations

from engine.observability import schema
from engine.observability.metrics import ServerMetrics
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
            receipts={schema.ADMISSION_PARK: 4, schema.REQUEUE: 1, schema.EVICTION: 7},
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
