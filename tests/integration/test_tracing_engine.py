"""The scheduler's spans, in-process on the tiny model: one request span per request under the
caller's span, its phases under it, its receipts as events on exactly its own span (under
pressure: parks, retractions), and every span ends, even when the engine stops mid-request."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.observability.tracing import DISABLED, Tracing, setup_tracing
from engine.scheduler.traces import RequestTraces
from tests.integration.test_pressure import three_at_once, workload


def traceparent(i: int) -> str:
    return f"00-{i + 1:032x}-{i + 1:016x}-01"


class OpenSpans(SpanProcessor):
    """Counts spans started and not yet ended."""

    def __init__(self) -> None:
        self.open = 0

    def on_start(self, span, parent_context=None) -> None:
        self.open += 1

    def on_end(self, span) -> None:
        self.open -= 1


@pytest.fixture
def traced():
    provider = TracerProvider(shutdown_on_exit=False)
    exporter, counter = InMemorySpanExporter(), OpenSpans()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(counter)
    yield Tracing(provider.get_tracer("test"), provider), exporter
    provider.shutdown()
    assert counter.open == 0, "a span was started and never ended"


def by_rid(spans, name: str) -> dict[str, list]:
    out = defaultdict(list)
    for s in spans:
        if s.name == name:
            out[s.attributes["attest.rid"]].append(s)
    return out


def test_unconfigured_tracing_attaches_nothing_and_starts_no_thread(tiny_model_dir):
    before = {t.name for t in threading.enumerate()}
    cfg = EngineConfig.from_kwargs(model=tiny_model_dir, kv_tokens=1024)
    tracing = setup_tracing(cfg.observability.otlp_endpoint, "scheduler", env={})
    assert tracing is DISABLED
    llm = LLM(model=tiny_model_dir, kv_tokens=1024, tracing=tracing)
    assert RequestTraces.of(tracing, llm.core.receipts) is None
    assert llm.core.scheduler.traces is None and llm.core.receipts.tap is None
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert {t.name for t in threading.enumerate()} == before


def test_pressure_receipts_land_on_their_own_request_spans(tiny_model_dir, traced):
    tracing, exporter = traced
    prompts, params = workload(300, n=16, seed=2)
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=three_at_once(prompts, params),
        chunk_tokens=32,
        max_running=8,
        check_invariants=True,
        relief_ladder=False,  # parks, not the ladder, pay
        tracing=tracing,
    )
    sched = llm.core.scheduler
    rids = [
        sched.add_request(p, q, trace_id=traceparent(i)).rid
        for i, (p, q) in enumerate(zip(prompts, params))
    ]
    while sched.has_work():
        sched.step()
    spans = exporter.get_finished_spans()
    receipts = llm.core.receipts
    requests = {s.attributes["attest.rid"]: s for s in spans if s.name == "scheduler.request"}
    assert sorted(requests) == sorted(rids)  # one span per request, each ended
    assert not sched.traces.live

    for i, rid in enumerate(rids):
        span = requests[rid]
        # under the caller's span, in the caller's trace
        assert span.context.trace_id == i + 1 and span.parent.span_id == i + 1
        fin = [r for r in receipts.of("request.finish") if r["rid"] == rid][0]
        assert fin["trace_id"] == f"{i + 1:032x}"  # the receipt names the trace
        assert span.attributes["gen_ai.usage.output_tokens"] == params[i].max_tokens
        assert span.attributes["gen_ai.usage.input_tokens"] == len(prompts[i])
        assert span.attributes["attest.parks"] == fin["parks"]
        assert span.attributes["attest.retractions"] == fin["retractions"]
    # every phase span is a child of its own request's span
    for s in spans:
        if s.name != "scheduler.request":
            parent = requests[s.attributes["attest.rid"]]
            assert s.parent.span_id == parent.context.span_id, s.name
            assert s.context.trace_id == parent.context.trace_id

    def event_rids(kind: str) -> list[str]:
        return sorted(rid for rid, s in requests.items() for e in s.events if e.name == kind)

    parked = sorted(r["rid"] for r in receipts.of("admission.park"))
    retracted = sorted(rid for r in receipts.of("retract") for rid in r["rids"])
    assert parked and retracted, "the pool never came under pressure"
    assert event_rids("admission.park") == parked
    assert event_rids("retract") == retracted
    assert event_rids("requeue") == sorted(r["rid"] for r in receipts.of("requeue"))
    # the event carries the receipt's fields
    park = receipts.of("admission.park")[0]
    ev = [e for e in requests[park["rid"]].events if e.name == "admission.park"][0]
    assert ev.attributes["need"] == park["need"] and ev.attributes["fundable"] == park["fundable"]

    # phases: a queue span per wait (received, and each requeue), a prefill span per admitted
    # chunk, a parked span per park, a decode span per run that reached its first token
    queues, prefills = by_rid(spans, "scheduler.queue"), by_rid(spans, "scheduler.prefill")
    parks, decodes = by_rid(spans, "scheduler.parked"), by_rid(spans, "scheduler.decode")
    for rid in rids:
        events = [e.name for e in requests[rid].events]
        assert len(queues[rid]) == 1 + events.count("requeue")
        assert len(prefills[rid]) == events.count("admission.admit")
        assert len(parks[rid]) == events.count("admission.park")
        # a decode span per run that sampled a token (a run can be retracted mid-prefill)
        generated = [0] + [
            e.attributes["generated"] for e in requests[rid].events if e.name == "requeue"
        ]
        assert len(decodes[rid]) == 1 + sum(b > a for a, b in zip(generated, generated[1:]))
        assert requests[rid].attributes["attest.chunks"] == len(prefills[rid])


def test_every_span_ends_when_the_engine_stops_mid_request(tiny_model_dir, traced):
    tracing, exporter = traced
    llm = LLM(model=tiny_model_dir, kv_tokens=2048, chunk_tokens=16, tracing=tracing)
    sched = llm.core.scheduler
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    for i in range(3):
        sched.add_request([5 + i] * 40, params, trace_id=traceparent(i))
    for _ in range(4):  # one decoding, one mid-prefill, one still waiting (max one chunked)
        sched.step()
    assert llm.core.shutdown("sigterm") == 3
    assert not sched.traces.live
    spans = exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "scheduler.request"]
    assert len(requests) == 3
    assert all(s.status.status_code is StatusCode.ERROR for s in requests)
    assert all([e.name for e in s.events][-1] == "request.abort" for s in requests)
    names = {s.name for s in spans}
    assert {"scheduler.queue", "scheduler.prefill", "scheduler.decode"} <= names


def test_a_drafted_requests_span_counts_its_drafts(tiny_model_dir, traced):
    """Asked twice, the second request is drafted for from the first's output (suffix)."""
    tracing, exporter = traced
    llm = LLM(model=tiny_model_dir, kv_tokens=4096, speculative="suffix", tracing=tracing)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    for _ in range(2):
        llm.generate([list(range(40, 80))], params)
    fin = {r["rid"]: r for r in llm.core.receipts.of("request.finish")}
    llm.close()
    spans = [s for s in exporter.get_finished_spans() if "attest.spec.proposed" in s.attributes]
    assert len(spans) >= 1 and fin["r-1"]["spec_accepted"] > 0
    for s in spans:
        f = fin[s.attributes["attest.rid"]]
        assert s.attributes["attest.spec.proposed"] == f["spec_proposed"] > 0
        assert s.attributes["attest.spec.accepted"] == f["spec_accepted"]
