"""Traces: OpenTelemetry spans for every request, exported over OTLP/HTTP (protobuf).

Off unless an endpoint is configured (``--otlp-endpoint``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_ENDPOINT``) and ``OTEL_SDK_DISABLED`` is not true. Off means no SDK
import, no provider, no exporter, no thread: the hot paths check one flag (``Tracing.enabled``,
or ``Scheduler.traces is None``). The SDK reads the other ``OTEL_*`` variables itself (headers,
timeout, sampler, batch delay); the service name defaults to ``attest``.

Each process that records spans sets up its own provider: the HTTP frontend writes one SERVER
span per HTTP request (continuing an incoming W3C ``traceparent``) and hands its context to the
scheduler inside the "add" message; the scheduler process writes, under it, one span per
scheduled request (a choice) with its receipts as events, and under that the phases: queue
(received or requeued -> admitted), parked, each prefill chunk, decode (first token -> end).

Tracing never raises into serving: a collector that is down costs dropped spans, said once per
process (one line on stderr and one ``notice`` receipt), and shutdown waits a bounded time.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

SERVICE_NAME = "attest"
PROVIDER_NAME = "attest"  # gen_ai.provider.name: the engine that served the request


def operation_of(api: str | None) -> str:
    """The GenAI operation name (``gen_ai.operation.name``) of a request that came by ``api``
    (``request.received``'s ``api``)."""
    return "text_completion" if api == "completions" else "chat"


SHUTDOWN_TIMEOUT_S = 2.0
TRACES_PATH = "/v1/traces"
# the loggers of the exporter and of the batch processor: their per-batch errors become one line
_NOISY_LOGGERS = ("opentelemetry.exporter", "opentelemetry.sdk._shared_internal")

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


# -- configuration ----------------------------------------------------------------------------


def traces_url(base: str) -> str:
    """An OTLP/HTTP base URL (``http://host:4318``) as its traces endpoint."""
    base = base.strip().rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def resolve_endpoint(flag: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """Where spans go, or None when tracing is off. The flag wins over the environment; the
    signal-specific variable is used as given, the generic one gets ``/v1/traces`` (as the OTLP
    specification says); ``OTEL_SDK_DISABLED=true`` turns everything off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if flag:
        return traces_url(flag)
    if v := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
        return v
    if v := env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        return traces_url(v)
    return None


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace id, parent span id) of a valid W3C ``traceparent``, else None."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None or m[1] == "ff" or m[2] == _ZERO_TRACE or m[3] == _ZERO_SPAN:
        return None
    return m[2], m[3]


def split_trace(trace: str | None) -> tuple[str | None, str | None]:
    """The scheduler's trace context as (trace id for receipts, traceparent to parent spans on).
    The frontend sends a traceparent; a bare trace id (offline callers) has no parent."""
    if trace and parse_traceparent(trace) is not None:
        trace = trace.strip().lower()
        return trace[3:35], trace
    return trace, None


# -- dropped spans ----------------------------------------------------------------------------


class _DropReporter:
    """Says once per process that spans are being dropped: one stderr line and ``on_drop``."""

    def __init__(self, process: str, on_drop: Callable[[str], None] | None) -> None:
        self.process = process
        self.on_drop = on_drop
        self.dropping = False  # said already
        self.failing = False  # the latest export failed (the exit then waits less for it)
        self.last_error: str | None = None  # the exporter's latest complaint, for the reason
        self._lock = threading.Lock()

    def complained(self, msg: str) -> None:
        """The exporter logged ``msg``: keep the cause (a retried connection error) over the
        generic final message."""
        if self.last_error is None or "due to timeout" not in msg:
            self.last_error = msg

    def exported(self, ok: bool) -> None:
        self.failing = not ok

    def report(self, reason: str) -> None:
        with self._lock:
            if self.dropping:
                return
            self.dropping = True
        text = f"spans are being dropped: {reason}"
        try:
            print(
                f"attest ({self.process}): {text}; further drops are not reported",
                file=sys.stderr,
                flush=True,
            )
            if self.on_drop is not None:
                self.on_drop(text)
        except Exception:
            pass  # a report about tracing must not fail either


class _ExporterLogHandler(logging.Handler):
    """Takes the exporter's and batch processor's log records (one per failed batch, plus
    retries): remembers the latest as the reason, and reports a full queue as a drop."""

    def __init__(self, reporter: _DropReporter) -> None:
        super().__init__(logging.WARNING)
        self.reporter = reporter

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            self.reporter.complained(msg)
            if "dropping" in msg.lower():
                self.reporter.report(msg)
        except Exception:
            pass


def _reporting_exporter(inner: Any, reporter: _DropReporter, url: str) -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class ReportingExporter(SpanExporter):
        """The OTLP exporter, made unable to raise, reporting its first failure."""

        def export(self, spans: Any) -> SpanExportResult:
            try:
                result = inner.export(spans)
            except Exception as e:
                reporter.exported(False)
                reporter.report(f"export to {url} failed ({type(e).__name__}: {e})")
                return SpanExportResult.FAILURE
            reporter.exported(result is SpanExportResult.SUCCESS)
            if reporter.failing:
                why = reporter.last_error or "the collector did not accept them"
                reporter.report(f"export to {url} failed ({why})")
            return result

        def shutdown(self) -> None:
            try:
                inner.shutdown()
            except Exception:
                pass

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    return ReportingExporter()


# -- one process's tracing --------------------------------------------------------------------


class Tracing:
    """One process's tracing: a provider, a batch processor and a tracer, or nothing (off)."""

    def __init__(
        self,
        tracer: Any = None,
        provider: Any = None,
        reporter: Any = None,
        exporter: Any = None,
        endpoint: str | None = None,
    ) -> None:
        self.enabled = tracer is not None
        self.endpoint = endpoint
        self.tracer = tracer
        self._provider = provider
        self._reporter = reporter
        self._exporter = exporter
        self._propagator: Any = None
        if self.enabled:
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )

            self._propagator = TraceContextTextMapPropagator()

    @property
    def failing(self) -> bool:
        """Whether the latest export failed (the collector is down now)."""
        return bool(self._reporter and self._reporter.failing)

    def context_from(self, carrier: Mapping[str, str] | None) -> Any:
        """The parent context in ``carrier`` (HTTP headers, or {"traceparent": ...})."""
        return self._propagator.extract(carrier or {})

    def start_span(
        self,
        name: str,
        *,
        parent: Any = None,
        kind: str = "INTERNAL",
        start_ns: int | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> Any:
        from opentelemetry.trace import SpanKind

        return self.tracer.start_span(
            name, context=parent, kind=SpanKind[kind], start_time=start_ns, attributes=attributes
        )

    @contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Any]:
        """A root span of its own trace around engine-level work (boot; later cutovers); yields
        the span, or None when tracing is off. An exception is recorded and re-raised."""
        if not self.enabled:
            yield None
            return
        from opentelemetry.context import Context

        span = self.start_span(name, parent=Context(), attributes=clean(attributes))
        try:
            yield span
        except BaseException as e:
            set_error(span, f"{type(e).__name__}: {e}")
            raise
        finally:
            span.end()

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Flush what is queued and stop, waiting at most ``timeout_s`` (much less while exports
        are failing): a dead collector must not hold up the exit."""
        if not self.enabled or self._provider is None:
            return
        provider, self._provider = self._provider, None
        t = threading.Thread(target=provider.shutdown, name="attest-trace-flush", daemon=True)
        t.start()
        t.join(0.2 if self.failing else timeout_s)
        if t.is_alive() and self._exporter is not None:
            self._exporter.shutdown()  # the final export is stuck in retries: abort them


DISABLED = Tracing()


def traceparent_of(span: Any) -> str:
    """The W3C traceparent naming ``span`` (what children in another process go under)."""
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def setup_tracing(
    endpoint_flag: str | None,
    process: str,
    on_drop: Callable[[str], None] | None = None,
    env: Mapping[str, str] = os.environ,
) -> Tracing:
    """This process's tracing. Off (``DISABLED``: nothing imported, nothing started) unless an
    endpoint is configured. Never raises: a set-up that fails is said once and tracing is off."""
    url = resolve_endpoint(endpoint_flag, env)
    if url is None:
        return DISABLED
    reporter = _DropReporter(process, on_drop)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        handler = _ExporterLogHandler(reporter)
        for name in _NOISY_LOGGERS:
            log = logging.getLogger(name)
            log.handlers = [h for h in log.handlers if not isinstance(h, _ExporterLogHandler)]
            log.addHandler(handler)
            log.propagate = False  # one line from us instead of one per failed batch
        resource = Resource.create({"attest.process": process})
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
        # our own bounded flush at exit, not the SDK's atexit hook (which waits up to 30 s)
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        exporter = _reporting_exporter(OTLPSpanExporter(endpoint=url), reporter, url)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return Tracing(provider.get_tracer("attest"), provider, reporter, exporter, url)
    except Exception as e:
        print(f"attest ({process}): tracing is off: {type(e).__name__}: {e}", file=sys.stderr)
        return DISABLED


# -- attributes -------------------------------------------------------------------------------


def clean(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Span attributes from receipt-like fields: None dropped, nested values as JSON text."""
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if v is None:
            continue
        if isinstance(v, (bool, int, float, str)):
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(
            isinstance(x, (bool, int, float, str)) for x in v
        ):
            out[k] = list(v) if len({type(x) for x in v}) <= 1 else [str(x) for x in v]
        else:
            import orjson

            out[k] = orjson.dumps(v, default=str).decode()
    return out


def set_error(span: Any, description: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, description))


def request_attributes(
    operation: str, model: str, params: Any, n: int, stream: bool
) -> dict[str, Any]:
    """GenAI semantic-convention attributes known when an HTTP request arrives."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": PROVIDER_NAME,
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": params.max_tokens,
        "gen_ai.request.temperature": float(params.temperature),
        "gen_ai.request.top_p": float(params.top_p),
        "gen_ai.request.stream": stream,
        "gen_ai.output.type": "text",
    }
    if params.top_k and params.top_k > 0:
        attrs["gen_ai.request.top_k"] = float(params.top_k)
    if params.seed is not None:
        attrs["gen_ai.request.seed"] = params.seed
    if n != 1:
        attrs["gen_ai.request.choice.count"] = n
    if params.stop:
        stops = [params.stop] if isinstance(params.stop, str) else list(params.stop)
        attrs["gen_ai.request.stop_sequences"] = stops
    if (guide := getattr(params, "guide", None)) is not None:  # constrained output
        attrs["gen_ai.output.type"] = "json" if guide.kind.startswith("json") else "text"
        attrs["attest.constrained"] = guide.kind
        attrs["attest.guide"] = guide.digest
    return attrs
