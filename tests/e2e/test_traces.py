"""Traces from a real `engine serve` (tiny model) exported over OTLP/HTTP to a receiver this
test runs on loopback: the caller's trace continued, GenAI attributes equal to the response,
receipts as events on the right request under memory pressure, a dead collector said once."""

from __future__ import annotations

import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from tests.e2e.server_proc import ServerProc, free_port

SERVER, INTERNAL, ERROR = 2, 1, 2  # protobuf enums: span kinds, status code
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


def traceparent(i: int, sampled: bool = True) -> tuple[str, str, str]:
    trace_id, span_id = f"{0xA77E57 + i:032x}", f"{0xC0FFEE + i:016x}"
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


def receipts(log) -> list[dict]:
    return [orjson.loads(line) for line in open(log, "rb") if line.strip()]


@pytest.fixture(scope="module")
def traced(receiver, tiny_model_dir, tmp_path_factory):
    """A server whose pool holds about three of the pressure test's requests at once, the relief
    ladder off: admission's floor parks, and parks are among the events the spans must carry."""
    log = tmp_path_factory.mktemp("traces") / "boot.jsonl"
    srv = ServerProc(
        log,
        "--model",
        tiny_model_dir,
        "--kv-tokens",
        "480",
        "--chunk-tokens",
        "32",
        "--max-running",
        "8",
        "--served-model-name",
        "tiny",
        "--otlp-endpoint",
        receiver.url,
        "--relief-ladder",
        "off",
        env=FAST_EXPORT,
    )
    yield srv
    srv.stop()


def spans_of(receiver, trace_id: str, n_requests: int = 1):
    """The spans of one trace, once the server span and ``n_requests`` request spans with all
    their phases are there."""

    def done(spans):
        mine = [s for s in spans if s.trace_id == trace_id]
        names = Counter(s.name for s in mine)
        return (
            sum(1 for s in mine if s.kind == SERVER) == 1
            and names["scheduler.request"] == n_requests
            and names["scheduler.decode"] >= n_requests
        )

    return [s for s in receiver.wait_for(done) if s.trace_id == trace_id]


def test_a_request_continues_the_callers_trace(traced, receiver):
    tp, trace_id, caller = traceparent(1)
    body = {
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 9,
        "temperature": 0.5,
        "ignore_eos": True,
    }
    r = httpx.post(traced.base + "/v1/chat/completions", json=body, headers={"traceparent": tp})
    assert r.status_code == 200, r.text
    resp = r.json()
    spans = spans_of(receiver, trace_id)
    (server,) = [s for s in spans if s.kind == SERVER]
    assert server.parent_id == caller  # continued, not a new trace
    assert server.name == "chat tiny"
    a = server.attrs
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "attest"
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "tiny"
    assert a["gen_ai.request.max_tokens"] == 9 and a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.response.id"] == resp["id"]
    usage = resp["usage"]
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 9
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert a["gen_ai.usage.cache_read.input_tokens"] == a["attest.cached_tokens"] == cached
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["http.response.status_code"] == 200
    assert a["attest.parks"] == 0 and a["attest.retractions"] == 0 and a["attest.ttft_s"] > 0
    assert server.resource["service.name"] == "attest"
    assert server.resource["attest.process"] == "frontend"

    (req,) = [s for s in spans if s.name == "scheduler.request"]
    assert req.parent_id == server.span_id and req.resource["attest.process"] == "scheduler"
    assert req.attrs["attest.rid"] == resp["id"]
    assert req.attrs["gen_ai.usage.output_tokens"] == 9
    phases = [s for s in spans if s.name not in ("scheduler.request",) and s.kind != SERVER]
    assert {s.name for s in phases} >= {"scheduler.queue", "scheduler.prefill", "scheduler.decode"}
    assert all(s.parent_id == req.span_id for s in phases)
    assert all(server.start_ns <= s.start_ns <= s.end_ns <= server.end_ns for s in phases)
    events = [name for name, _ in req.events]
    assert events[0] == "request.received" and events[-1] == "request.finish"
    assert "admission.admit" in events
    # the receipts name the trace: from a receipt to its trace and back
    (rec,) = [
        x
        for x in receipts(traced.log_file)
        if x.get("rid") == resp["id"] and x["event"] == "request.received"
    ]
    assert rec["trace_id"] == trace_id
    assert dict(req.events)["request.received"]["trace_id"] == trace_id  # the receipt's fields


def test_n_choices_stream_share_one_server_span(traced, receiver):
    tp, trace_id, caller = traceparent(2)
    body = {
        "prompt": [5, 6, 7, 8, 9],
        "max_tokens": 6,
        "n": 2,
        "seed": 1,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage = rid = None
    with httpx.stream(
        "POST", traced.base + "/v1/completions", json=body, headers={"traceparent": tp}
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = orjson.loads(line[6:])
                rid = chunk["id"]
                usage = chunk.get("usage") or usage
    spans = spans_of(receiver, trace_id, n_requests=2)
    (server,) = [s for s in spans if s.kind == SERVER]
    assert server.parent_id == caller
    assert server.attrs["gen_ai.request.choice.count"] == 2
    assert server.attrs["gen_ai.request.stream"] is True
    assert server.attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 12
    assert server.attrs["gen_ai.response.finish_reasons"] == ["length", "length"]
    reqs = [s for s in spans if s.name == "scheduler.request"]
    assert sorted(s.attrs["attest.rid"] for s in reqs) == [f"{rid}-0", f"{rid}-1"]
    assert all(s.parent_id == server.span_id for s in reqs)


def test_a_request_without_traceparent_gets_a_trace_of_its_own(traced, receiver):
    r = httpx.post(traced.base + "/v1/completions", json={"prompt": [7, 8], "max_tokens": 2})
    assert r.status_code == 200
    rid = r.json()["id"]
    spans = receiver.wait_for(
        lambda ss: any(s.kind == SERVER and s.attrs.get("attest.rid") == rid for s in ss)
    )
    (server,) = [s for s in spans if s.kind == SERVER and s.attrs.get("attest.rid") == rid]
    assert server.parent_id == ""
    (rec,) = [
        x
        for x in receipts(traced.log_file)
        if x.get("rid") == rid and x["event"] == "request.received"
    ]
    assert rec["trace_id"] == server.trace_id


def test_boot_is_a_trace_of_its_own(traced, receiver):
    spans = receiver.wait_for(lambda ss: any(s.name == "boot" for s in ss))
    (boot,) = [s for s in spans if s.name == "boot"]
    assert boot.parent_id == "" and boot.resource["attest.process"] == "scheduler"
    assert boot.attrs["attest.kv_tokens"] == 480 and boot.attrs["attest.startup_s"] > 0
    start = [x for x in receipts(traced.log_file) if x["event"] == "boot.start"][0]
    assert boot.attrs["attest.boot"] == start["boot"]
    assert not [s for s in spans if s.trace_id == boot.trace_id and s.name != "boot"]


def test_under_pressure_parks_and_retractions_are_on_the_right_request(traced, receiver):
    rng = random.Random(7)

    def send(job):
        (tp, trace_id, _), prompt, n = job
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
        with httpx.Client(timeout=120) as c:
            r = c.post(traced.base + "/v1/completions", json=body, headers={"traceparent": tp})
        assert r.status_code == 200, r.text
        return r.json()["id"], trace_id, r.json()["usage"]

    # arrivals over HTTP are timed by the machine: send waves until both parks and retractions
    # happened (every wave's requests are checked below, not only the last one's)
    sent: list = []
    for wave in range(4):
        jobs = []
        for i in range(12):
            prompt = [rng.randrange(2, 300) for _ in range(rng.randint(40, 160))]
            jobs.append((traceparent(1000 * (wave + 1) + i), prompt, rng.randint(60, 120)))
        with ThreadPoolExecutor(len(jobs)) as pool:
            sent += list(pool.map(send, jobs))
        trace_of = {rid: trace_id for rid, trace_id, _ in sent}
        log = receipts(traced.log_file)
        parked = Counter(
            x["rid"] for x in log if x["event"] == "admission.park" and x["rid"] in trace_of
        )
        retracted = Counter(
            rid for x in log if x["event"] == "retract" for rid in x["rids"] if rid in trace_of
        )
        if parked and retracted:
            break
    for x in log:
        if x["event"] == "request.received" and x["rid"] in trace_of:
            assert x["trace_id"] == trace_of[x["rid"]]
    assert parked and retracted, "the pool never came under pressure: nothing to check"

    def all_there(spans):  # both processes export on their own schedule
        done = {(s.name, s.trace_id, s.attrs.get("attest.rid")) for s in spans}
        return all(
            (name, t, rid) in done
            for rid, t in trace_of.items()
            for name in ("text_completion tiny", "scheduler.request")
        )

    spans = [s for s in receiver.wait_for(all_there) if s.trace_id in set(trace_of.values())]
    req_span = {s.attrs["attest.rid"]: s for s in spans if s.name == "scheduler.request"}
    assert set(req_span) == set(trace_of)
    for rid, span in req_span.items():
        assert span.trace_id == trace_of[rid]  # the rid's span is in that rid's trace
    span_parks = Counter(
        {
            rid: n
            for rid, s in req_span.items()
            if (n := [e for e, _ in s.events].count("admission.park"))
        }
    )
    span_retracts = Counter(
        {rid: n for rid, s in req_span.items() if (n := [e for e, _ in s.events].count("retract"))}
    )
    assert span_parks == parked
    assert span_retracts == retracted
    # the HTTP span reports the same counts, and the usage the client got
    for rid, trace_id, usage in sent:
        (server,) = [s for s in spans if s.trace_id == trace_id and s.kind == SERVER]
        assert server.attrs["attest.parks"] == parked[rid]
        assert server.attrs["attest.retractions"] == retracted[rid]
        assert server.attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    # a parked chunk shows as a parked span; a decode span for each run that sampled a token
    for rid in parked:
        assert any(s.name == "scheduler.parked" and s.attrs["attest.rid"] == rid for s in spans)
    tokens = {rid: usage["completion_tokens"] for rid, _, usage in sent}
    for rid in retracted:
        decodes = [
            s for s in spans if s.name == "scheduler.decode" and s.attrs["attest.rid"] == rid
        ]
        assert len(decodes) == runs_that_decoded(req_span[rid].events, tokens[rid])


def runs_that_decoded(events, tokens: int) -> int:
    """Runs of a request (split by its requeues) that reached their decode phase: a request can
    be retracted mid-prefill, before its run had a first token; and a last run whose one token
    was sampled by its prefill (retracted one token short of ``tokens``, its answer's) ended in
    that step, so it never decoded."""
    generated = [0] + [f["generated"] for name, f in events if name == "requeue"]
    runs = 1 + sum(b > a for a, b in zip(generated, generated[1:]))
    return runs - (tokens - generated[-1] == 1)


def test_a_closed_collector_port_drops_spans_not_requests(tiny_model_dir, tmp_path):
    log = tmp_path / "boot.jsonl"
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    srv = ServerProc(
        log,
        "--model",
        tiny_model_dir,
        "--kv-tokens",
        "1024",
        "--otlp-endpoint",
        dead,
        env={**FAST_EXPORT, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1"},
    )
    try:
        for i in range(4):
            r = httpx.post(
                srv.base + "/v1/completions",
                json={"prompt": [5, 6, 7 + i], "max_tokens": 4},
                headers={"traceparent": traceparent(200 + i)[0]},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            time.sleep(0.3)  # several batches, each failing

        def notices():
            return [
                x
                for x in receipts(log)
                if x["event"] == "notice" and x["text"].startswith("spans are being dropped")
            ]

        deadline = time.monotonic() + 120
        while len(notices()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert httpx.get(srv.base + "/health").status_code == 200
    finally:
        t0 = time.monotonic()
        code, out = srv.stop()
        took = time.monotonic() - t0
    assert code == 0, out
    assert sorted(x["process"] for x in notices()) == ["frontend", "scheduler"]
    assert all(dead in x["text"] for x in notices())
    assert out.count("attest (frontend): spans are being dropped") == 1, out
    assert out.count("attest (scheduler): spans are being dropped") == 1, out
    assert "Traceback" not in out and "Failed to export" not in out.replace("(Failed to export", "")
    assert took < 10, f"a dead collector held up the exit: {took:.1f} s"
