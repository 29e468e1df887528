"""Cutover over HTTP, against a real `engine serve` (tiny model): `POST /admin/cutover` behind
the API key, bad bodies named, a pool resized under streaming load with every stream finished,
a second cutover while one drains refused 409, a missing weights file refused 400 with serving
going on, a pool shrink that would break promises refused 409 then capped on request (the
streams end ``length``, /health shows the new pool at once, new requests meet the new pool), a
cutover under way cancelled by ``DELETE``, `engine cutover` as an operator runs it, /metrics counting cutovers, the `cutover`
span with its phases at the OTLP receiver, and the `cutover` window deciding the boot log."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import orjson
import pytest

from tests.e2e.server_proc import ServerProc

KEY = "cutover-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
POOL = 1024


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """The tiny model with a context long enough that a stream outlasts a few admin calls by
    thousands of tokens (the module's weights cutovers load it again: same shape)."""
    from tests.tiny_model import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-long"), max_position=4096))


@pytest.fixture(scope="module")
def srv(model_dir, receiver, tmp_path_factory):
    log = tmp_path_factory.mktemp("cutover-http") / "boot.jsonl"
    s = ServerProc(
        log,
        "--model",
        model_dir,
        "--kv-tokens",
        str(POOL),
        "--max-running",
        "8",
        "--api-key",
        KEY,
        "--otlp-endpoint",
        receiver.url,
        env={"OTEL_BSP_SCHEDULE_DELAY": "100"},
    )
    yield s
    s.stop()


def cut(srv, **body) -> httpx.Response:
    return httpx.post(srv.base + "/admin/cutover", json=body, headers=AUTH, timeout=120)


def receipts(srv, kind: str) -> list[dict]:
    lines = srv.log_file.read_bytes().splitlines()
    return [orjson.loads(x) for x in lines if f'"{kind}"'.encode() in x]


def stream(srv, prompt: str, n: int, got: dict) -> None:
    """Stream a greedy completion of ``n`` tokens; ``got[prompt]``: (status, finish reason)."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", srv.base + "/v1/completions", json=body, headers=AUTH, timeout=600
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                if reason := orjson.loads(line[6:])["choices"][0].get("finish_reason"):
                    got[prompt] = (r.status_code, reason)


def running(srv) -> int:
    return httpx.get(srv.base + "/health", timeout=60).json()["running"]


def wait_until(pred, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_route_needs_the_key_and_names_what_is_wrong(srv):
    r = httpx.post(srv.base + "/admin/cutover", json={"kind": "pool", "mode": "carry"})
    assert r.status_code == 401
    for body, param in (
        ({"mode": "carry"}, "kind"),
        ({"kind": 3, "mode": "carry"}, "kind"),
        ({"kind": "pool", "mode": "carry", "size": 9}, "size"),
    ):
        r = cut(srv, **body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = cut(srv, kind="pool", mode="carry", kv_tokens=0)
    assert r.status_code == 400 and r.json()["cutover"]["outcome"] == "rejected", r.text


def test_a_pool_cutover_under_streaming_load_finishes_every_stream(srv):
    got: dict[str, tuple[int, str]] = {}
    prompts = [f"Story number {i} begins" for i in range(6)]
    # long enough that they are still running when the cutovers come: at 60 tokens the tiny
    # model could finish all six between two looks at /health, and the wait never ended
    threads = [threading.Thread(target=stream, args=(srv, p, 300, got)) for p in prompts]
    for t in threads:
        t.start()
    wait_until(lambda: running(srv) > 0 or len(got) == len(prompts))
    grow = cut(srv, kind="pool", mode="carry", kv_tokens=2 * POOL)
    assert grow.status_code == 200 and grow.json()["outcome"] == "ok", grow.text
    shrink = cut(srv, kind="pool", mode="carry", kv_tokens=POOL)
    assert shrink.status_code == 200 and shrink.json()["kv_tokens"] == POOL, shrink.text
    for t in threads:
        t.join(120)
    assert got == {p: (200, "length") for p in prompts}
    assert httpx.get(srv.base + "/health", timeout=60).json()["kv_total"] == POOL
    metrics = httpx.get(srv.base + "/metrics", headers=AUTH, timeout=60).text
    assert 'attest:cutovers_total{kind="pool",outcome="ok"} 2.0' in metrics
    assert 'attest:cutover_last_pause_seconds{kind="pool"}' in metrics


def test_a_second_cutover_while_one_drains_is_409_and_the_first_ends_ok(srv, model_dir):
    got: dict[str, tuple[int, str]] = {}
    long = threading.Thread(target=stream, args=(srv, "A long tale", 200, got))
    long.start()
    wait_until(lambda: running(srv) > 0)
    first: list[httpx.Response] = []
    drain = threading.Thread(
        target=lambda: first.append(cut(srv, kind="weights", mode="drain", path=model_dir))
    )
    drain.start()
    wait_until(lambda: len(receipts(srv, "cutover.begin")) > len(receipts(srv, "cutover.end")))
    second = cut(srv, kind="pool", mode="carry", kv_tokens=POOL)
    assert second.status_code == 409 and "under way" in second.json()["error"]["message"]
    late = threading.Thread(target=stream, args=(srv, "Arrived during the cutover", 5, got))
    late.start()  # the new weights load while serving goes on; the drain holds the line after
    for t in (drain, long, late):
        t.join(120)
    assert got == {"A long tale": (200, "length"), "Arrived during the cutover": (200, "length")}
    (answer,) = first
    assert answer.status_code == 200 and answer.json()["mode"] == "drain", answer.text
    assert answer.json()["pause_s"] > 0


def test_a_missing_weights_file_is_refused_and_serving_goes_on(srv, tmp_path):
    r = cut(srv, kind="weights", mode="carry", path=str(tmp_path / "nothing-here"))
    assert r.status_code == 400 and "does not exist" in r.json()["error"]["message"], r.text
    assert r.json()["cutover"]["outcome"] == "rejected"
    body = {"prompt": "Still serving", "max_tokens": 3, "ignore_eos": True}
    ok = httpx.post(srv.base + "/v1/completions", json=body, headers=AUTH, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_engine_cutover_as_an_operator_runs_it(srv):
    cmd = [
        sys.executable,
        "-m",
        "cli.engine_app",
        "cutover",
        "pool",
        "--kv-tokens",
        str(POOL),
        "--url",
        srv.base,
        "--api-key",
        KEY,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["outcome"] == "ok"
    cmd[cmd.index("--kv-tokens") + 1] = "0"  # less than one page
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "400" in refused.stderr, refused.stderr


def test_a_pool_shrink_keeps_the_promises_it_found_end_to_end(srv):
    assert cut(srv, kind="pool", mode="carry", kv_tokens=8 * POOL).status_code == 200
    got: dict[str, tuple[int, str]] = {}
    prompts = ["A promised tale", "Another promised tale"]  # each promised about 3,500
    # a shrink to 3,072 finds them more than 2,500 tokens short of its in-flight minimum
    threads = [threading.Thread(target=stream, args=(srv, p, 3500, got)) for p in prompts]
    for t in threads:
        t.start()
    wait_until(lambda: running(srv) == len(prompts))
    small = 3 * POOL
    refused = cut(srv, kind="pool", mode="carry", kv_tokens=small)
    assert refused.status_code == 409, refused.text
    named = refused.json()["cutover"]["promises"]
    assert len(named) == len(prompts) and all(p["promised"] > small for p in named)
    assert all(p["rid"] in refused.json()["error"]["message"] for p in named)
    capped = cut(srv, kind="pool", mode="carry", kv_tokens=small, promises="cap")
    assert capped.status_code == 200 and capped.json()["kv_tokens"] == small, capped.text
    assert httpx.get(srv.base + "/health", timeout=60).json()["kv_total"] == small  # at once
    body = {"prompt": "x", "max_tokens": 3100}  # fits the pool before, not this one
    late = httpx.post(srv.base + "/v1/completions", json=body, headers=AUTH, timeout=60)
    assert late.status_code == 400 and f"KV pool of {small}" in late.text, late.text
    for t in threads:
        t.join(600)
    assert got == {p: (200, "length") for p in prompts}
    caps = receipts(srv, "request.cap")
    assert {c["rid"] for c in caps} == {p["rid"] for p in named}
    assert cut(srv, kind="pool", mode="carry", kv_tokens=POOL).status_code == 200


def test_a_cutover_under_way_is_cancelled_by_delete(srv, tmp_path):
    import os

    fifo = tmp_path / "weights.gguf"
    os.mkfifo(fifo)  # weights whose read never returns
    first: list[httpx.Response] = []
    load = threading.Thread(
        target=lambda: first.append(cut(srv, kind="weights", mode="carry", path=str(fifo)))
    )
    load.start()
    wait_until(lambda: len(receipts(srv, "cutover.begin")) > len(receipts(srv, "cutover.end")))
    cid = receipts(srv, "cutover.begin")[-1]["id"]
    r = httpx.delete(f"{srv.base}/admin/cutover/{cid}", headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["outcome"] == "cancelled", r.text
    load.join(60)
    (answer,) = first
    assert answer.status_code == 409 and answer.json()["cutover"]["outcome"] == "cancelled"
    again = httpx.delete(f"{srv.base}/admin/cutover/{cid}", headers=AUTH, timeout=60)
    assert again.status_code == 404 and "no cutover" in again.json()["error"]["message"]
    cmd = [
        sys.executable,
        "-m",
        "cli.engine_app",
        "cutover",
        "--cancel",
        cid,
        "--url",
        srv.base,
        "--api-key",
        KEY,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "404" in done.stderr, done.stderr
    try:  # the abandoned read ends (EOF) once a writer has come and gone
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_the_cutover_span_has_its_phases_and_the_window_decides_the_log(srv, receiver, model_dir):
    assert cut(srv, kind="weights", mode="carry", path=model_dir).status_code == 200
    assert cut(srv, kind="pool", mode="carry", kv_tokens=POOL).status_code == 200

    def children(spans, kind: str) -> set[str]:
        roots = [
            s.span_id
            for s in spans
            if s.name == "cutover" and s.attrs.get("attest.cutover.kind") == kind
        ]
        return {s.name for s in spans if s.parent_id in roots}

    spans = receiver.wait_for(
        lambda sp: children(sp, "weights") >= {"load", "carry"} and "carry" in children(sp, "pool")
    )
    for root in (s for s in spans if s.name == "cutover"):
        assert root.parent_id == "" and root.attrs["attest.cutover.outcome"] in (
            "ok",
            "rejected",
            "cancelled",
        )
    verdict = subprocess.run(
        [sys.executable, "-m", "cli.audit_app", "verdict", str(srv.log_file), "--spec", "cutover"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verdict.returncode == 0 and "overall: PASS" in verdict.stdout, verdict.stdout
