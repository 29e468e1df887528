"""Tracing's set-up: off unless configured (and then nothing runs), the endpoint rules, W3C
traceparent parsing, GenAI attribute names, and a dead collector that is said once and never
holds up the exit."""

from __future__ import annotations

import threading
import time

import pytest

from engine.config import EngineConfig
from engine.model.sampling import SamplingParams
from engine.observability import tracing as tr
from tests.e2e.server_proc import free_port

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def otel_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if "Otel" in t.name or "attest-trace" in t.name]


@pytest.mark.parametrize(
    ("flag", "env", "want"),
    [
        (None, {}, None),
        ("http://127.0.0.1:4318", {}, "http://127.0.0.1:4318/v1/traces"),
        ("http://127.0.0.1:4318/", {}, "http://127.0.0.1:4318/v1/traces"),
        ("http://c:4318/v1/traces", {}, "http://c:4318/v1/traces"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318/v1/traces"),
        # the signal-specific variable is used as given, and wins over the generic one
        (
            None,
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
            },
            "http://t:1/x",
        ),
        (
            "http://flag:1",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
            "http://flag:1/v1/traces",
        ),
        ("http://flag:1", {"OTEL_SDK_DISABLED": "TRUE"}, None),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, None),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, None),
    ],
)
def test_endpoint_rules(flag, env, want):
    assert tr.resolve_endpoint(flag, env) == want


def test_unconfigured_tracing_is_the_disabled_one_and_starts_no_thread():
    before = otel_threads()
    t = tr.setup_tracing(None, "test", env={})
    assert t is tr.DISABLED and not t.enabled and t.tracer is None
    assert otel_threads() == before == []
    with t.span("boot") as span:  # engine-level spans cost nothing when off
        assert span is None
    t.shutdown()
    # the SDK-disabled switch wins over a configured endpoint
    assert tr.setup_tracing("http://127.0.0.1:1", "test", env={"OTEL_SDK_DISABLED": "true"}) is (
        tr.DISABLED
    )
    assert otel_threads() == []


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (TP, ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")),
        (TP.upper(), ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")),
        (None, None),
        ("", None),
        ("garbage", None),
        ("00-" + "0" * 32 + "-b7ad6b7169203331-01", None),  # all-zero trace id
        ("00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01", None),  # all-zero parent
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),  # forbidden version
    ],
)
def test_traceparent_parsing(value, want):
    assert tr.parse_traceparent(value) == want


def test_split_trace_gives_receipts_the_bare_trace_id():
    assert tr.split_trace(TP) == ("0af7651916cd43dd8448eb211c80319c", TP)
    assert tr.split_trace("0af7651916cd43dd8448eb211c80319c") == (
        "0af7651916cd43dd8448eb211c80319c",
        None,
    )
    assert tr.split_trace(None) == (None, None)


def test_genai_attributes_use_the_current_names():
    params = SamplingParams(max_tokens=7, temperature=0.5, top_k=20, seed=3, stop=["\n"])
    attrs = tr.request_attributes("chat", "smol", params, 2, True)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "attest"
    assert attrs["gen_ai.request.model"] == "smol"
    assert attrs["gen_ai.request.max_tokens"] == 7
    assert attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.request.choice.count"] == 2
    assert attrs["gen_ai.request.stop_sequences"] == ["\n"]
    assert not [k for k in attrs if "prompt_tokens" in k or "completion_tokens" in k]
    assert "gen_ai.system" not in attrs  # deprecated for gen_ai.provider.name


def test_clean_makes_receipt_fields_valid_attributes():
    got = tr.clean({"a": 1, "b": None, "c": ["x", "y"], "d": [["r-1", 3, 40]], "e": [1, "x"]})
    assert got == {"a": 1, "c": ["x", "y"], "d": '[["r-1",3,40]]', "e": ["1", "x"]}


@pytest.mark.parametrize("url", ["127.0.0.1:4318", "ftp://h:1", "http://", "http://h:99999", 5])
def test_config_rejects_a_bad_otlp_endpoint(url):
    with pytest.raises(ValueError, match="otlp_endpoint must be None or an http"):
        EngineConfig.from_kwargs(otlp_endpoint=url)


def test_config_accepts_an_http_endpoint():
    url = "https://collector.example:4318"
    assert EngineConfig.from_kwargs(otlp_endpoint=url).observability.otlp_endpoint == url


def test_a_dead_collector_is_said_once_and_never_holds_up_the_exit(monkeypatch, capsys):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    said: list[str] = []
    t = tr.setup_tracing(f"http://127.0.0.1:{free_port()}", "test", on_drop=said.append, env={})
    try:
        assert t.enabled and otel_threads() == ["OtelBatchSpanRecordProcessor"]
        for _ in range(3):
            for i in range(3):
                with t.span("work", i=i):
                    pass
            time.sleep(0.3)
        deadline = time.monotonic() + 120
        while not said and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # more failed batches: still said once
    finally:
        t0 = time.monotonic()
        t.shutdown()
        took = time.monotonic() - t0
    assert len(said) == 1 and said[0].startswith("spans are being dropped: export to http://127")
    err = capsys.readouterr().err
    assert err.count("spans are being dropped") == 1
    assert "Failed to export" not in err.replace(said[0], "")  # the SDK's own per-batch noise
    assert took < 1.0, f"shutdown with a dead collector took {took:.2f} s"


def test_shutdown_is_bounded_while_an_export_is_still_retrying(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # only the shutdown flush exports
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", raising=False)  # 10 s of retries
    said: list[str] = []
    t = tr.setup_tracing(f"http://127.0.0.1:{free_port()}", "test", on_drop=said.append, env={})
    with t.span("boot"):
        pass
    t0 = time.monotonic()
    t.shutdown(timeout_s=0.5)
    assert time.monotonic() - t0 < 1.5
    deadline = time.monotonic() + 60
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said, "the spans lost at shutdown were not said"
