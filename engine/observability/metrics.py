"""Prometheus metrics for `engine serve`, under the ``attest:`` prefix.

Two sources: the frontend times what a client sees (time to first token, inter-token latency,
end-to-end) and counts tokens; the scheduler's snapshot, sent with every step, gives the gauges
(running, waiting, parked, KV use) and the decision counters, which are the receipt counts
themselves, so /metrics and the boot log cannot disagree about how many parks there were. A
receipt the boot log could not take (its disk full) is a decision still made: the decision
counters count it, ``attest:receipts_total`` counts only the receipts written and
``attest:receipts_failed_total`` the others, so the two can be told apart.

prometheus_client is used for the exposition format (escaping, histogram buckets, content
type) rather than writing that format again; its registry is per app, never the global one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from engine.observability import schema
from engine.observability.tracing import PROVIDER_NAME, operation_of
from engine.request.messages import PoolSnapshot, SpecCounts

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip


def _seconds(bounds: str) -> tuple[float, ...]:
    return tuple(float(b) for b in bounds.split())


# The OpenTelemetry GenAI semantic conventions' server histograms (gen_ai.server.*, in seconds),
# with the bucket boundaries they advise.
_GENAI_TTFT_BUCKETS = _seconds(
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10"
)
_GENAI_TPOT_BUCKETS = _seconds("0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5")
_GENAI_DURATION_BUCKETS = _seconds(
    "0.01 0.02 0.04 0.08 0.16 0.32 0.64 1.28 2.56 5.12 10.24 20.48 40.96 81.92"
)
_GENAI_LABELS = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")
_SUCCESS = ("stop", "length")  # the finish reasons of a successful response

# decision counters: metric name -> (receipt kind, help)
_DECISIONS = {
    "attest:parks": (schema.ADMISSION_PARK, "Chunks parked because the pool could not fund them."),
    "attest:unparks": (schema.ADMISSION_UNPARK, "Parked chunks funded again."),
    "attest:retractions": (schema.REQUEUE, "Running requests retracted and requeued."),
    "attest:evictions": (schema.EVICTION, "Prefix-cache evictions."),
    "attest:aborts": (schema.REQUEST_ABORT, "Requests that ended abnormally."),
    "attest:oom": (schema.ALLOC_OOM, "Allocations that failed after the allocation-site net."),
    "attest:eviction_under_delivered": (
        schema.EVICTION_UNDER_DELIVERED,
        "Evictions that freed less than the evictable counter promised (law 1 broken).",
    ),
    "attest:invariant_violations": (
        schema.INVARIANT_VIOLATION,
        "Checked invariants that failed (the ledger, the counters), once per kind.",
    ),
}

# outcome counters, from the receipts of schema.TALLIES: metric -> (receipt kind, label, help)
_TALLIED = {
    "attest:relief_rungs": (
        schema.RELIEF_RUNG,
        "outcome",
        "Relief ladder rungs climbed, by outcome (paid, short, raised: the rung failed).",
    ),
    "attest:grammar_compiles": (
        schema.GRAMMAR_COMPILE,
        "outcome",
        "Grammar compiles and cache hits, by outcome (ok; refused: invalid, timeout, error, busy).",
    ),
    "attest:kv_store_quarantines": (
        schema.STORE_QUARANTINE,
        "reason",
        "Files of the durable KV store set aside into quarantine/, by reason.",
    ),
    "attest:kv_store_loads": (
        schema.STORE_LOAD,
        "outcome",
        "Prefix loads from the durable KV store, by outcome (error: a page unreadable or corrupt).",
    ),
    "attest:kv_store_writes": (
        schema.STORE_WRITE,
        "outcome",
        "Page writes to the durable KV store, by outcome (error: a write that failed).",
    ),
}


class _EngineCollector:
    """Gauges and counters read from the scheduler's latest snapshot at scrape time."""

    def __init__(self, snapshot: Callable[[], PoolSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        for name, value, help_ in (
            ("running", s.running, "Requests decoding or prefilling."),
            ("waiting", s.waiting, "Requests waiting to be admitted."),
            ("parked", s.parked, "Requests whose next chunk is parked until memory frees."),
        ):
            yield GaugeMetricFamily(f"attest:num_requests_{name}", help_, value=value)
        yield GaugeMetricFamily(
            "attest:kv_usage_ratio",
            "KV pool fraction held by requests (not free, not evictable cache).",
            value=s.kv_used / s.kv_total if s.kv_total else 0.0,
        )
        g = GaugeMetricFamily("attest:kv_tokens", "KV pool token slots by state.", labels=["state"])
        for state, value in (
            ("used", s.kv_used),
            ("cached", s.kv_cached),
            ("evictable", s.kv_evictable),
            ("free", s.kv_free),
            ("total", s.kv_total),
        ):
            g.add_metric([state], value)
        yield g
        counts = s.receipts
        for name, (kind, help_) in _DECISIONS.items():
            yield CounterMetricFamily(name, help_, value=counts.get(kind, 0))
        yield from _tallied(s.tallies)
        if s.spec is not None:
            yield from _spec_metrics(s.spec)
        if s.store is not None:
            g = GaugeMetricFamily(
                "attest:kv_store_bytes",
                "The durable KV store's allocated bytes on disk: cap, used, pinned (by "
                "checkpoints), reclaimable (what eviction can free).",
                labels=["state"],
            )
            for state, value in s.store.items():
                g.add_metric([state], value)
            yield g
        for name, help_, by_kind in (
            ("attest:receipts", "Receipts written, by kind.", s.receipts_written),
            (
                "attest:receipts_failed",
                "Receipts that could not be written (the boot log's disk full, say), by kind.",
                s.receipts_failed,
            ),
        ):
            c = CounterMetricFamily(name, help_, labels=["kind"])
            for kind in sorted(by_kind):
                c.add_metric([kind], by_kind[kind])
            yield c


def _tallied(tallies: Mapping[tuple[str, str], int]) -> Iterator[Metric]:
    """The outcome counters; every value of a kind's closed list is there from boot, at 0, so
    a rule's ``increase`` sees the first one counted."""
    for name, (kind, label, help_) in _TALLIED.items():
        seen = {said: n for (k, said), n in tallies.items() if k == kind}
        c = CounterMetricFamily(name, help_, labels=[label])
        for said in dict.fromkeys((*schema.TALLIES[kind].values, *sorted(seen))):
            c.add_metric([said], seen.get(said, 0))
        yield c


def _spec_metrics(spec: SpecCounts) -> Iterator[Metric]:
    """Speculative decoding's counters, under vLLM's names."""
    for name, value, help_ in (
        ("drafts", spec.drafts, "Verifications of a request's drafts."),
        ("draft_tokens", spec.draft_tokens, "Draft tokens verified."),
        ("accepted_tokens", spec.accepted_tokens, "Draft tokens the model kept."),
    ):
        yield CounterMetricFamily(f"attest:spec_decode_num_{name}", help_, value=value)
    c = CounterMetricFamily(
        "attest:spec_decode_num_accepted_tokens_per_pos",
        "Draft tokens kept, by position in the drafts (0: the first).",
        labels=["position"],
    )
    for pos, value in enumerate(spec.accepted_per_pos):
        c.add_metric([str(pos)], value)
    yield c


class _LoopCollector:
    """The HTTP process's event loop as its watch measures it: (stalls, lag of the last turn)."""

    def __init__(self, read: Callable[[], tuple[int, float]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        stalls, lag = self._read()
        yield CounterMetricFamily(
            "attest:frontend_loop_stalls",
            "Times the HTTP process's event loop stood past "
            "--loop-stall-timeout (each a frontend.stall receipt).",
            value=stalls,
        )
        yield GaugeMetricFamily(
            "attest:frontend_loop_lag_seconds",
            "How late the HTTP process's event loop's last turn came.",
            value=lag,
        )


class _SchedulerCollector:
    """The scheduler process as the HTTP process hears it: (alive, seconds since it last spoke)."""

    def __init__(self, read: Callable[[], tuple[bool, float]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        up, age = self._read()
        yield GaugeMetricFamily(
            "attest:scheduler_up",
            "1 while the scheduler process runs; 0 once it died (the server then stops).",
            value=1.0 if up else 0.0,
        )
        yield GaugeMetricFamily(
            "attest:scheduler_heartbeat_age_seconds",
            "Seconds since the scheduler process last spoke (it beats every 0.5 s; past "
            "--stall-timeout /health answers 503, and scheduler.stall follows when it turns).",
            value=age,
        )


class ServerMetrics:
    def __init__(
        self,
        snapshot: Callable[[], PoolSnapshot],
        loop: Callable[[], tuple[int, float]] = lambda: (0, 0.0),
        scheduler: Callable[[], tuple[bool, float]] = lambda: (True, 0.0),
        model: str = "",
    ) -> None:
        """``snapshot``: the scheduler's latest pool snapshot (``EngineDriver.stats``);
        ``loop``: the HTTP loop's stalls and lag (``LoopWatch``); ``scheduler``: whether the
        scheduler process lives and its heartbeat's age (``EngineDriver``); ``model``: the
        served model's name (the GenAI histograms' ``gen_ai_request_model``)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.model = model
        r = self.registry
        self.prompt_tokens = Counter("attest:prompt_tokens", "Prompt tokens prefilled.", registry=r)
        self.cached_tokens = Counter(
            "attest:cached_prompt_tokens",
            "Prompt tokens served from the prefix cache.",
            registry=r,
        )
        self.generation_tokens = Counter(
            "attest:generation_tokens", "Tokens generated.", registry=r
        )
        # one count per scheduler request (a choice), when its ending arrives: stop and length
        # (each a request.finish receipt), abort (each a request.abort receipt), rejected (the
        # scheduler refused it), error (the scheduler never took it: no receipt)
        self.requests = Counter(
            "attest:requests",
            "Requests ended, by finish reason (stop, length, abort, rejected, error).",
            ["finish_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "attest:time_to_first_token_seconds",
            "Time to first token, as the client sees it.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "attest:inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "attest:e2e_request_latency_seconds",
            "Request latency, arrival to last token.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cutovers = Counter(
            "attest:cutovers",
            "Cutovers ended, by kind (weights, pool) and outcome (ok, rejected, failed).",
            ["kind", "outcome"],
            registry=r,
        )
        self.cutover_pause = Gauge(
            "attest:cutover_last_pause_seconds",
            "Seconds the last cutover that ended held new work from starting, by kind.",
            ["kind"],
            registry=r,
        )
        self.rejections = Counter(
            "attest:http_rejections",
            "Requests the HTTP frontend answered with an error (each "
            "a request.rejected receipt), by route template, status and the request field "
            "named (none; other: a name no request body has).",
            ["route", "status", "field"],
            registry=r,
        )
        self._genai(r)
        r.register(_EngineCollector(snapshot))
        r.register(_LoopCollector(loop))
        r.register(_SchedulerCollector(scheduler))

    def _genai(self, r: CollectorRegistry) -> None:
        """The GenAI server histograms: the same timings as attest's own (one measurement,
        two names), as the conventions define them."""
        self.genai_ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time to generate the first token, for successful responses (gen_ai.server."
            "time_to_first_token).",
            _GENAI_LABELS,
            buckets=_GENAI_TTFT_BUCKETS,
            registry=r,
        )
        self.genai_tpot = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Time per output token after the first, for successful responses (gen_ai.server."
            "time_per_output_token).",
            _GENAI_LABELS,
            buckets=_GENAI_TPOT_BUCKETS,
            registry=r,
        )
        self.genai_duration = Histogram(
            "gen_ai_server_request_duration_seconds",
            "Request duration, arrival to last token; error_type: how a failed one ended "
            "(gen_ai.server.request.duration).",
            ("error_type", *_GENAI_LABELS),
            buckets=_GENAI_DURATION_BUCKETS,
            registry=r,
        )

    def cutover(self, fields: dict) -> None:
        """Count a cutover that ended (its ``cutover.end`` fields)."""
        kind = str(fields.get("kind"))
        self.cutovers.labels(kind, str(fields.get("outcome"))).inc()
        if fields.get("outcome") == "ok":
            self.cutover_pause.labels(kind).set(float(fields.get("pause_s") or 0.0))

    def rejected(self, route: str, status: int, field: str) -> None:
        self.rejections.labels(route, str(status), field).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def timer(self, prompt_tokens: int, t0_ns: int, api: str | None = None) -> RequestTimer:
        """``api``: the HTTP API the request came by (``request.received``'s ``api``)."""
        return RequestTimer(self, prompt_tokens, t0_ns, operation_of(api))


class RequestTimer:
    """One request's timings from its arrival (``t0_ns``, wall clock), fed as its outputs
    arrive. ``prompt_tokens`` 0: a further choice of the same prompt, whose prompt and cached
    tokens are counted once, by the first."""

    __slots__ = ("m", "prompt_tokens", "t0_ns", "first_ns", "last_ns", "ended", "n", "labels")

    def __init__(
        self, m: ServerMetrics, prompt_tokens: int, t0_ns: int, operation: str = "chat"
    ) -> None:
        self.m = m
        self.prompt_tokens = prompt_tokens
        self.t0_ns = t0_ns
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.ended = False
        self.n = 0  # output tokens
        self.labels = (operation, PROVIDER_NAME, m.model)

    def tokens(self, n: int, cached: int = 0) -> None:
        if n <= 0:
            return
        now = time.time_ns()
        if self.last_ns is None:
            self.first_ns = now
            self.m.ttft.observe((now - self.t0_ns) / 1e9)
            if self.prompt_tokens:
                self.m.prompt_tokens.inc(self.prompt_tokens)
                self.m.cached_tokens.inc(cached)
        else:
            gap = (now - self.last_ns) / 1e9 / n
            for _ in range(n):
                self.m.itl.observe(gap)
        self.m.generation_tokens.inc(n)
        self.last_ns = now
        self.n += n

    def end(self, reason: str | None) -> None:
        if self.ended:
            return
        self.ended = True
        m, how = self.m, reason or "abort"
        duration = (time.time_ns() - self.t0_ns) / 1e9
        m.e2e.observe(duration)
        m.requests.labels(how).inc()
        ok = how in _SUCCESS
        m.genai_duration.labels("" if ok else how, *self.labels).observe(duration)
        if not ok or self.first_ns is None or self.last_ns is None:
            return
        m.genai_ttft.labels(*self.labels).observe((self.first_ns - self.t0_ns) / 1e9)
        if self.n > 1:  # the decode's time over the tokens after the first
            tpot = (self.last_ns - self.first_ns) / 1e9 / (self.n - 1)
            m.genai_tpot.labels(*self.labels).observe(tpot)
