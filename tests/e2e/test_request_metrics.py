"""Each request's timings in its answer (``--enable-per-request-metrics``, as vLLM's flag of that
name): a ``metrics`` object beside ``usage`` whose numbers are its ``request.finish`` receipt's,
on a request with a prefix hit and one without, streamed (in the usage chunk) and not; none
for several choices, and none at all without the flag."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.e2e.server_proc import ServerProc

PROMPT = [100 + i for i in range(80)]  # five pages of 16: a second run finds them cached
KEYS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms"}


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("request-metrics") / "boot.jsonl"
    s = ServerProc(
        log,
        "--model",
        tiny_model_dir,
        "--kv-tokens",
        "2048",
        "--served-model-name",
        "m",
        "--enable-per-request-metrics",
    )
    yield s
    s.stop()


def ask(base: str, stream: bool = False, **more) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, "stream": stream, **more}
    if not stream:
        r = httpx.post(base + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()
    body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        events = [orjson.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert all("metrics" not in e for e in events[:-1])  # only the usage chunk has them
    return events[-1]


def expected(srv, rid: str) -> dict:
    """vLLM's fields, from the request's request.finish receipt."""
    lines = srv.log_file.read_bytes().splitlines()
    (end,) = [r for x in lines if b'"request.finish"' in x and (r := orjson.loads(x))["rid"] == rid]
    q, first, e2e, n = end["queue_s"], end["ttft_s"], end["e2e_s"], end["tokens"]
    return {
        "time_to_first_token_ms": round((first - q) * 1e3, 3),
        "generation_time_ms": round((e2e - first) * 1e3, 3),
        "queue_time_ms": round(q * 1e3, 3),
        "mean_itl_ms": round((e2e - first) / (n - 1) * 1e3, 3),
        "tokens_per_second": round(n / (e2e - q), 3),
        "cached": end["cached"],
    }


@pytest.mark.parametrize("stream", [False, True])
def test_the_timings_are_the_receipts_with_and_without_a_prefix_hit(srv, stream):
    prompt = [3 if stream else 4, *PROMPT]  # each case's own: its first run is cold
    cold, warm = ask(srv.base, stream, prompt=prompt), ask(srv.base, stream, prompt=prompt)
    for answer, hit in ((cold, False), (warm, True)):
        want = expected(srv, answer["id"])
        assert (want.pop("cached") > 0) is hit
        assert answer["metrics"] == want


def test_a_messages_answer_has_the_same_timings_whole_and_streamed(srv):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi there"}]}
    whole = httpx.post(srv.base + "/v1/messages", json=body, timeout=300).json()
    got = {"whole": (whole["id"], whole["metrics"])}
    with httpx.stream(
        "POST", srv.base + "/v1/messages", json={**body, "stream": True}, timeout=300
    ) as r:
        data = [orjson.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    start = next(d for d in data if d["type"] == "message_start")
    last = next(d for d in data if d["type"] == "message_delta")
    got["streamed"] = (start["message"]["id"], last["metrics"])
    for rid, metrics in got.values():
        want = expected(srv, rid.replace("msg_", "msg-"))  # the receipts name it msg-<hex>
        want.pop("cached")
        assert metrics == want


def test_a_responses_answer_has_the_same_timings_whole_and_in_its_completed_event(srv):
    body = {"model": "m", "input": "hi there", "max_output_tokens": 4, "store": False}
    whole = httpx.post(srv.base + "/v1/responses", json=body, timeout=300).json()
    got = [(whole["id"], whole["metrics"])]
    with httpx.stream(
        "POST", srv.base + "/v1/responses", json={**body, "stream": True}, timeout=300
    ) as r:
        data = [orjson.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert all("metrics" not in d.get("response", {}) for d in data[:-1])
    (ended,) = [
        d["response"] for d in data if d["type"] in ("response.completed", "response.incomplete")
    ]
    got.append((ended["id"], ended["metrics"]))
    for rid, metrics in got:
        want = expected(srv, rid.replace("resp_", "resp-"))  # the receipts name it resp-<hex>
        want.pop("cached")
        assert metrics == want


def test_several_choices_have_no_one_requests_timings(srv):
    answer = ask(srv.base, n=2)
    assert "metrics" in answer and answer["metrics"] is None


def test_without_the_flag_the_answer_has_no_metrics(tiny_model_dir, tmp_path):
    s = ServerProc(tmp_path / "boot.jsonl", "--model", tiny_model_dir, "--kv-tokens", "1024")
    try:
        assert "metrics" not in ask(s.base) and "metrics" not in ask(s.base, stream=True)
    finally:
        s.stop()
