"""`engine serve` as a real process on loopback, spoken to over real HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import orjson
import pytest

from tests.conftest import requires_default_model

pytestmark = requires_default_model
API_KEY = "test-key-123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def boot_log(tmp_path_factory):
    return tmp_path_factory.mktemp("serve") / "boot.jsonl"


@pytest.fixture(scope="module")
def server(boot_log):
    port = _free_port()
    cmd = [
        sys.executable, "-m", "cli.engine_app", "serve", "--port", str(port),
        "--kv-tokens", "4096", "--max-running", "8", "--served-model-name", "smol",
        "--api-key", API_KEY, "--log-file", str(boot_log),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited early:\n{proc.stdout.read()}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("server did not become healthy in 90 s")
        time.sleep(0.3)
    client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    yield client
    client.close()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


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
        (b'{"prompt": "hi", "n": 5}', 400, "n"),
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


def test_concurrent_streams_all_complete(server):
    import concurrent.futures as cf

    def one(i):
        r = server.post(
            "/v1/completions",
            json={
                "prompt": f"Count to {i}:",
                "max_tokens": 10,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        return r.json()["usage"]["completion_tokens"]

    with cf.ThreadPoolExecutor(6) as ex:
        assert list(ex.map(one, range(6))) == [10] * 6
    assert server.get("/health").json()["kv_used"] == 0


def test_the_boot_log_holds_a_receipt_for_each_request(server, boot_log):
    r = server.post(
        "/v1/completions", json={"prompt": "Say yes.", "max_tokens": 2, "ignore_eos": True}
    )
    rid = r.json()["id"]
    events = [orjson.loads(x) for x in boot_log.read_bytes().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[:3] == ["boot.start", "boot.pool_sized", "boot.ready"]
    mine = [e["event"] for e in events if e.get("rid") == rid]
    assert mine == ["request.received", "admission.admit", "request.finish"]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))  # no lost line


def test_a_client_that_goes_away_frees_its_memory(server, boot_log):
    body = {"prompt": "Write a long story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with server.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one chunk, then hang up
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        h = server.get("/health").json()
        if h["running"] == 0 and h["kv_used"] == 0:
            break
        time.sleep(0.2)
    assert h["running"] == 0 and h["kv_used"] == 0, h
    aborts = [
        orjson.loads(x) for x in boot_log.read_bytes().splitlines() if b'"request.abort"' in x
    ]
    assert aborts and aborts[-1]["reason"] == "client_disconnect" and aborts[-1]["tokens"] < 2000


def _scheduler_child(pid: int) -> int:
    """The server's scheduler process (not multiprocessing's resource tracker)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for child in map(int, f.read().split()):
                with open(f"/proc/{child}/cmdline", "rb") as c:
                    if b"resource_tracker" not in c.read():
                        found.append(child)
    assert len(found) == 1, found
    return found[0]


def test_a_dead_scheduler_is_a_503_with_the_reason_never_a_hang(tmp_path):
    port = _free_port()
    cmd = [sys.executable, "-m", "cli.engine_app", "serve", "--port", str(port), "--kv-tokens", "2048",
           "--log-file", str(tmp_path / "boot.jsonl")]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.3)
        child = _scheduler_child(proc.pid)
        os.kill(child, signal.SIGKILL)
        time.sleep(1.0)
        r = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=10)
        assert r.status_code == 503 and "scheduler" in r.json()["error"]["message"]
        h = httpx.get(base + "/health", timeout=10)
        assert h.status_code == 503 and "exited" in h.json()["error"]["message"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
