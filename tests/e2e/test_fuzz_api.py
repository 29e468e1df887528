"""Schemathesis against the server's own OpenAPI document: a bounded number of generated
requests, valid and invalid per the published schemas, to every route. No answer may be a 5xx,
none may hang, every answer must be one the document lists (status, content type, the error
object's shape), and the server must serve normally afterwards.

A tiny model with a 64-token context keeps every valid case short (a 400 or a few tokens)."""

from __future__ import annotations

import collections
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.e2e.server_proc import ServerProc

CASES = 500  # generated requests, across the routes and both modes
# a case that takes longer is a hang (and the server's own request deadline): every case is a
# 400 or a few tokens of a tiny model, so only a hang comes near it, never a busy machine
CASE_TIMEOUT_S = 120
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzzed(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("fuzz") / "boot.jsonl"
    srv = ServerProc(
        log,
        "--model",
        tiny_model_dir,
        "--kv-tokens",
        "256",
        "--max-model-len",
        "64",
        "--request-timeout",
        str(CASE_TIMEOUT_S),
        "--read-timeout",
        "5",
    )
    yield srv
    srv.stop()


def test_generated_requests_find_no_5xx_no_hang_and_the_server_still_serves(fuzzed):
    schema = schemathesis.openapi.from_url(fuzzed.base + "/openapi.json")
    cases = st.one_of(
        schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE)
    )
    seen: collections.Counter = collections.Counter()

    @settings(
        max_examples=CASES,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def one(case):
        t0 = time.monotonic()
        response = case.call(base_url=fuzzed.base, timeout=CASE_TIMEOUT_S + 10)
        seen[f"{case.method} {case.path} -> {response.status_code}"] += 1
        assert time.monotonic() - t0 < CASE_TIMEOUT_S, "a case hung"
        case.validate_response(response, checks=CHECKS)

    one()
    print(f"\n{sum(seen.values())} generated requests:")
    for key, count in sorted(seen.items()):
        print(f"  {count:4d}  {key}")
    assert sum(seen.values()) >= CASES // 2  # the bound ran, not a handful
    assert any(k.startswith("POST") and k.endswith("200") for k in seen), seen  # valid ones ran
    assert any(k.startswith("POST") and k.endswith("400") for k in seen), seen
    # still serving, with nothing left behind
    r = httpx.post(fuzzed.base + "/v1/completions", json={"prompt": "The quick", "max_tokens": 3})
    assert r.status_code == 200, r.text
    h = httpx.get(fuzzed.base + "/health").json()
    assert h["status"] == "ok" and h["running"] == 0 and h["kv_used"] == 0
    code, out = fuzzed.stop()
    assert code == 0 and "Traceback" not in out, out[-3000:]
