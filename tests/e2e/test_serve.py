"""`engine serve` as a real process on loopback, spoken to over real HTTP."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from tests.conftest import requires_default_model
from tests.e2e.conftest import API_KEY

pytestmark = requires_default_model


def test_models_lists_the_served_name(server):
    data = server.get("/v1/models").json()
    assert [m["id"] for m in data["data"]] == ["smol"]


def test_chat_completion_answers_and_counts_usage(server):
    r = server.post(
        "/v1/chat/completions",
        json={
            "model": "smol",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_completion_tokens": 20,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "The capital of France is Paris."
    assert body["choices"][0]["finish_reason"] == "stop"
    u = body["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_a_repeated_prompt_reports_cached_tokens(server):
    req = {
        "prompt": "Tell me something about the tides and the moon.",
        "max_tokens": 3,
        "temperature": 0,
    }
    first = server.post("/v1/completions", json=req).json()["usage"]
    second = server.post("/v1/completions", json=req).json()["usage"]
    assert first["prompt_tokens"] == second["prompt_tokens"]
    # the whole prompt but its last token comes from the prefix cache the second time
    assert second["prompt_tokens_details"]["cached_tokens"] == second["prompt_tokens"] - 1


def test_content_parts_equal_plain_string(server):
    def ask(content):
        r = server.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": content}],
                "temperature": 0,
                "max_tokens": 12,
            },
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    assert ask("Name a fruit.") == ask(
        [{"type": "text", "text": "Name a "}, {"type": "text", "text": "fruit."}]
    )


def test_streaming_completion_matches_non_streaming(server):
    req = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    full = server.post("/v1/completions", json=req).json()
    chunks, done = [], False
    with server.stream(
        "POST",
        "/v1/completions",
        json={**req, "stream": True, "stream_options": {"include_usage": True}},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            if line == "data: [DONE]":
                done = True
                break
            chunks.append(orjson.loads(line[6:]))
    assert done
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == full["choices"][0]["text"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 16
    assert [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"] == "length"


def _events(server, path: str, body: dict) -> list[dict]:
    """A stream's events, parsed, up to [DONE] (which must come)."""
    events = []
    with server.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line == "data: [DONE]":
                return events
            if line:
                events.append(orjson.loads(line.removeprefix("data: ")))
    raise AssertionError("the stream ended without [DONE]")


def test_continuous_usage_stats_puts_each_choices_usage_so_far_in_every_chunk(server):
    """vLLM's ``stream_options.continuous_usage_stats`` (load generators such as guidellm send
    it): with ``include_usage``, every chunk carries the usage of its choice so far; the last
    event is still the whole request's usage. Without ``include_usage`` it adds nothing."""
    req = {
        "messages": [{"role": "user", "content": "Count to ten."}],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "n": 2,
        "stream": True,
    }
    opts = {"include_usage": True, "continuous_usage_stats": True}
    events = _events(server, "/v1/chat/completions", {**req, "stream_options": opts})
    *chunks, last = events
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 16
    prompt = last["usage"]["prompt_tokens"]
    for i in range(2):
        mine = [c for c in chunks if c["choices"][0]["index"] == i]
        done = [c["usage"]["completion_tokens"] for c in mine]
        assert done[0] == 0 and done[-1] == 8 and done == sorted(done), done
        assert all(c["usage"]["prompt_tokens"] == prompt for c in mine)
        assert all(c["usage"]["total_tokens"] == prompt + d for c, d in zip(mine, done))
    plain = _events(
        server,
        "/v1/completions",
        {
            "prompt": "Hi",
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"continuous_usage_stats": True},
        },
    )
    assert plain and not any("usage" in e for e in plain)


def test_truncate_prompt_tokens_keeps_the_last_k_tokens_of_the_prompt(server):
    """vLLM's ``truncate_prompt_tokens``: the prompt's last k tokens are what runs (usage
    counts k), so what came before them changes nothing. A prompt within k runs whole; 0 or
    below -1 is a 400 naming the field."""
    base = {"max_tokens": 6, "temperature": 0, "ignore_eos": True, "truncate_prompt_tokens": 5}
    text = "The quick brown fox jumps over the lazy dog. " * 3

    def complete(**body):
        r = server.post("/v1/completions", json={**base, **body})
        assert r.status_code == 200, r.text
        return r.json()

    cut = complete(prompt=text)
    assert cut["usage"]["prompt_tokens"] == 5
    other = complete(prompt="Something else entirely, and longer than that. " + text)
    assert other["usage"]["prompt_tokens"] == 5
    assert other["choices"][0]["text"] == cut["choices"][0]["text"]
    whole = complete(prompt=text, truncate_prompt_tokens=10_000)
    assert whole["usage"]["prompt_tokens"] > 20
    chat = server.post(
        "/v1/chat/completions",
        json={**base, "truncate_prompt_tokens": 3, "messages": [{"role": "user", "content": text}]},
    )
    assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] == 3
    for bad in (0, -2):
        r = server.post(
            "/v1/completions", json={**base, "prompt": text, "truncate_prompt_tokens": bad}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b'{"prompt": "hi", "temperature": -0.5}', 400, "temperature"),
        (b'{"prompt": "hi", "top_p": 0}', 400, "top_p"),
        (b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
        (b'{"prompt": "hi", "max_tokens": 100000}', 400, "max_tokens"),
        (b'{"prompt": ""}', 400, "prompt"),
        (b'{"prompt": "hi", "model": "gpt-9"}', 404, "model"),
        (b'{"prompt": "hi", "n": 17}', 400, "n"),
        (b'{"prompt": "hi", "n": 0}', 400, "n"),
        (b'{"prompt": "hi", "logprobs": 21}', 400, "logprobs"),
        (b'{"prompt": "hi", "top_p": 1.5}', 400, "top_p"),
        (b'{"prompt": [1, 2, 99999999]}', 400, "prompt"),
        (b'{"prompt": 12}', 400, "prompt"),
        (b"[1, 2]", 400, None),
        (b'{"max_tokens": 3}', 400, "prompt"),
        (b'{"prompt": "hi", "max_tokens": "many"}', 400, "max_tokens"),
    ],
)
def test_bad_input_is_a_clear_4xx(server, body, status, param):
    r = server.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"]
    assert err["param"] == param
    # the server is still serving afterwards, with nothing left behind
    health = server.get("/health").json()
    assert health["running"] == 0 and health["kv_used"] == 0


def test_wrong_api_key_is_401(server):
    r = httpx.post(
        str(server.base_url) + "/v1/completions",
        json={"prompt": "hi"},
        headers={"Authorization": "Bearer wrong"},
    )
    assert r.status_code == 401
    assert "API key" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (f"bearer {API_KEY}", 200),
        (f"BEARER {API_KEY}", 200),
        (f"bEaReR {API_KEY}", 200),
        (f"Bearer {API_KEY}", 200),
        (f"bearer {API_KEY.upper()}", 401),
        ("bearer wrong", 401),
        (f"Basic {API_KEY}", 401),
        ("bearer", 401),
        (API_KEY, 401),
    ],
)
def test_the_auth_scheme_is_read_in_any_case_and_the_key_exactly(server, authorization, status):
    """RFC 9110 11.1: an authentication scheme is case-insensitive; the key is not."""
    r = httpx.get(str(server.base_url) + "/v1/models", headers={"Authorization": authorization})
    assert r.status_code == status, r.text


def test_32_concurrent_streams_all_complete_and_memory_returns_to_idle(server):
    import concurrent.futures as cf

    idle = server.get("/health").json()

    def one(i):
        body = {
            "prompt": f"Count to {i}:",
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        text, usage = [], None
        with server.stream(
            "POST", "/v1/completions", json=body, timeout=600
        ) as r:  # a loaded machine is slow, not wrong
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    c = orjson.loads(line[6:])
                    text += [x["text"] for x in c["choices"]]
                    usage = c.get("usage") or usage
        return usage["completion_tokens"], "".join(text)

    with cf.ThreadPoolExecutor(32) as ex:
        results = list(ex.map(one, range(32)))
    assert [n for n, _ in results] == [12] * 32
    assert all(text for _, text in results)
    after = server.get("/health").json()
    assert after["running"] == after["waiting"] == after["kv_used"] == 0
    assert after["kv_free"] + after["kv_evictable"] == idle["kv_free"] + idle["kv_evictable"]


def test_the_boot_log_holds_a_receipt_for_each_request(server, boot_log):
    r = server.post(
        "/v1/completions", json={"prompt": "Say yes.", "max_tokens": 2, "ignore_eos": True}
    )
    rid = r.json()["id"]
    events = [orjson.loads(x) for x in boot_log.read_bytes().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[:3] == ["boot.start", "boot.weights", "boot.pool_sized"]
    assert kinds.index("boot.ready") < kinds.index("request.received")  # ready means serving
    mine = [e["event"] for e in events if e.get("rid") == rid]
    assert mine == ["request.received", "admission.admit", "request.finish"]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))  # no lost line


def test_a_client_that_goes_away_frees_its_memory(server, boot_log):
    body = {"prompt": "Write a long story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with server.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                rid = orjson.loads(line[6:])["id"]
                break  # one chunk, then hang up
    # freed within moments of the hang-up; a leak would be forever, so the wait's limit is roomy
    # (a busy host ran out of 1 s here; it is an upper bound, not waited out)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        h = server.get("/health").json()
        if h["running"] == 0 and h["kv_used"] == 0:
            break
        time.sleep(0.2)
    assert h["running"] == 0 and h["kv_used"] == 0, h
    aborts = [
        orjson.loads(x) for x in boot_log.read_bytes().splitlines() if b'"request.abort"' in x
    ]
    (mine,) = [a for a in aborts if a["rid"] == rid]  # aborted, not run to its end
    assert mine["reason"] == "client_disconnect" and mine["tokens"] < 2000


def test_n_choices_are_separate_requests_with_one_usage(server):
    body = {
        "prompt": "Name a colour:",
        "max_tokens": 6,
        "n": 3,
        "temperature": 1.0,
        "seed": 7,
        "ignore_eos": True,
    }
    r = server.post("/v1/completions", json=body).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert r["usage"]["completion_tokens"] == 18
    texts = [c["text"] for c in r["choices"]]
    assert len(set(texts)) > 1  # seeded choices still differ from one another
    again = server.post("/v1/completions", json=body).json()
    assert [c["text"] for c in again["choices"]] == texts  # and the seed reproduces them


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_the_limit_is_413(server, declared):
    big = b'{"prompt": "' + b"a" * (4 * 1024 * 1024 + 10) + b'"}'
    json_body = {"content-type": "application/json"}
    if declared:
        r = server.post("/v1/completions", content=big, headers=json_body)
    else:  # chunked: no content-length to reject up front
        r = server.post(
            "/v1/completions", content=iter([big[:1000], big[1000:]]), headers=json_body
        )
    assert r.status_code == 413
    assert "exceeds" in r.json()["error"]["message"]
    assert server.get("/health").json()["kv_used"] == 0


def test_metrics_count_what_the_server_did(served, server):
    before = served.metrics()
    n_out = 0
    for i in range(3):
        r = server.post(
            "/v1/completions", json={"prompt": f"Hello {i}", "max_tokens": 5, "ignore_eos": True}
        ).json()
        n_out += r["usage"]["completion_tokens"]
    after = served.metrics()

    def grew(name):
        return after.get(name, 0) - before.get(name, 0)

    assert grew("attest:generation_tokens_total") == n_out
    assert grew("attest:prompt_tokens_total") > 0
    assert grew("attest:time_to_first_token_seconds_count") == 3
    assert grew("attest:e2e_request_latency_seconds_count") == 3
    assert grew("attest:inter_token_latency_seconds_count") == n_out - 3
    assert grew('attest:requests_total{finish_reason="length"}') == 3
    assert grew('attest:receipts_total{kind="request.finish"}') == 3
    for name in (
        "attest:num_requests_running",
        "attest:num_requests_waiting",
        "attest:num_requests_parked",
        "attest:kv_usage_ratio",
        "attest:parks_total",
        "attest:retractions_total",
        "attest:evictions_total",
        "attest:aborts_total",
    ):
        assert name in after, name
    assert after["attest:kv_usage_ratio"] == 0.0
    assert after['attest:kv_tokens{state="total"}'] == 4096


def test_a_non_streaming_client_that_goes_away_frees_its_memory(served, server, boot_log):
    import socket

    body = orjson.dumps({"prompt": "Write a long story.", "max_tokens": 3000, "ignore_eos": True})
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    aborted = len([x for x in boot_log.read_bytes().splitlines() if b'"request.abort"' in x])
    with socket.create_connection(("127.0.0.1", served.port)) as s:
        s.sendall(head.encode() + body)
        deadline = time.monotonic() + 300
        while server.get("/health").json()["running"] == 0:  # wait until it is decoding
            assert time.monotonic() < deadline
            time.sleep(0.1)
    deadline = time.monotonic() + 120  # hung up: freed within moments (as above)
    while time.monotonic() < deadline:
        h = server.get("/health").json()
        if h["running"] == 0 and h["kv_used"] == 0:
            break
        time.sleep(0.1)
    assert h["running"] == 0 and h["kv_used"] == 0, h
    aborts = [x for x in boot_log.read_bytes().splitlines() if b'"request.abort"' in x]
    assert len(aborts) == aborted + 1  # this one was aborted, not run to its end
    last = orjson.loads(aborts[-1])
    assert last["reason"] == "client_disconnect" and last["tokens"] < 3000


def test_a_bad_prompt_is_refused_in_the_words_of_the_one_prompt_check(server):
    from engine.request.prompt import PromptError, check_prompt

    context = server.get("/v1/models").json()["data"][0]["max_model_len"]
    for ids in ([], [1] * context):
        # the offline API's words for the same prompt (every id here is in the vocabulary)
        with pytest.raises(PromptError) as fault:
            check_prompt(ids, vocab_size=2, max_context=context)
        expected = str(fault.value)
        r = server.post("/v1/completions", json={"prompt": ids, "max_tokens": 1})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == {
            "message": expected,
            "type": "invalid_request_error",
            "param": "prompt",
            "code": 400,
        }


def test_the_frontend_process_never_loads_torch(served, server):
    """The HTTP process parses, streams and reads the scheduler's messages without the model
    stack; only the scheduler process maps torch's libraries (read from /proc, so the check
    needs no endpoint of its own)."""
    r = server.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "stream": True})
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")

    def torch_libraries(pid: int) -> set[str]:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split()[-1] for line in f if "/torch/" in line}

    assert torch_libraries(served.scheduler_pid())  # the check sees torch where it is
    assert torch_libraries(served.proc.pid) == set()
