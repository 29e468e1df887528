"""A large schema is its own client's wait, nobody else's, over HTTP on a real server (the tiny
model): with a 1 MB schema being checked, /health and another client's stream answer while the
schema's request is still open (the checks run off the event loop); a compile past its limit is
ended, and the server's CPU is free again; with every compile worker busy, another compile is
refused as load (503 with Retry-After) with a receipt.

Order, not time: "while still open" is the schema request's socket having no answer yet at the
moment health's answer (or the stream's chunk) arrived. The CPU test is a deadline test, its
bound far from the work: a compile that ran on would spend a core, the whole window."""

from __future__ import annotations

import select
import socket
import threading
import time

import httpx
import orjson
import psutil
import pytest

from tests.e2e.http_raw import _answer, head
from tests.e2e.server_proc import ServerProc
from tests.tiny_model import make_tiny_model

LIMIT_S = 5  # --grammar-timeout: far below the slow compiles here (minutes)
STREAM = {"prompt": [5, 6, 7, 8], "max_tokens": 3000, "ignore_eos": True, "stream": True}


def guided(schema: dict) -> bytes:
    """A completion held to ``schema``: the whole request, headers and body."""
    body = orjson.dumps(
        {
            "prompt": [5, 6, 7],
            "max_tokens": 4,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema},
            },
        }
    )
    return head("/v1/completions", len(body)) + body


def checked_then_refused() -> dict:
    """About 1 MB of schema whose checks read all of it: 85,000 subschemas, the last one
    asking for a keyword the grammar cannot hold (refused once the walk reaches it)."""
    props: dict = {f"p{i:05x}": {} for i in range(85_000)}
    props["last"] = {"type": "array", "uniqueItems": True}
    return {"type": "object", "properties": props}


def slow_to_compile(tag: str, n: int = 14_000) -> dict:
    """About 1 MB of valid schema (14,000 properties): minutes to compile."""
    return {
        "type": "object",
        "properties": {
            f"{tag}_{i:06d}": {"type": "string", "description": "a field"} for i in range(n)
        },
    }


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("schema-in-flight")
    model = str(make_tiny_model(d / "model", max_position=4096))
    s = ServerProc(
        d / "boot.jsonl",
        "--model",
        model,
        "--kv-tokens",
        "8192",
        "--grammar-timeout",
        str(LIMIT_S),
        "--grammar-workers",
        "1",
        "--grammar-waiting",
        "0",
    )
    yield s
    code, out = s.stop()
    assert code == 0, out


def send(port: int, request: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=300)
    s.sendall(request)
    return s


def answered(s: socket.socket) -> bool:
    return bool(select.select([s], [], [], 0)[0])


def receipts(srv: ServerProc, event: str) -> list[dict]:
    lines = srv.log_file.read_bytes().splitlines()
    return [r for r in map(orjson.loads, lines) if r["event"] == event]


def test_health_and_a_stream_answer_while_a_1mb_schema_is_checked(srv):
    """What arrives while the schema's request is open (checked as it arrives): /health's
    answers, and between two of them a chunk of the other client's stream, read as it comes.
    A loop held by the checks answers nothing until the schema's 400 is written."""
    lock = threading.Lock()
    open_: list[socket.socket] = []  # the schema's request, once sent
    came: list[str] = []  # what arrived while it was open, in order
    flowing, stop = threading.Event(), threading.Event()

    def note(what: str) -> None:
        with lock:
            if open_ and not answered(open_[0]):
                came.append(what)

    def read_stream() -> None:
        with httpx.stream("POST", srv.base + "/v1/completions", json=STREAM, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    flowing.set()
                    note("chunk")
                if stop.is_set():
                    return

    reader = threading.Thread(target=read_stream, daemon=True)
    reader.start()
    assert flowing.wait(120)
    s = send(srv.port, guided(checked_then_refused()))
    open_.append(s)
    with httpx.Client(base_url=srv.base, timeout=120) as client:
        while not answered(s):
            if client.get("/health").status_code == 200:
                note("health")
    stop.set()
    status, body, _ = _answer(s, 0.0)
    reader.join(120)
    s.close()
    assert (status, body["error"]["param"]) == (
        400,
        "response_format.json_schema.schema.properties.last.uniqueItems",
    ), body
    healths = [i for i, what in enumerate(came) if what == "health"]
    assert len(healths) >= 2, f"/health answered {len(healths)} time(s) while it was open"
    assert "chunk" in came[healths[0] : healths[-1]], "the stream stood still meanwhile"


def server_cpu_s(srv: ServerProc) -> float:
    """CPU seconds spent by the server's processes (frontend, scheduler, compile workers)."""
    total = 0.0
    root = psutil.Process(srv.proc.pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def test_a_compile_past_its_limit_is_ended_and_the_servers_cpu_is_free(srv):
    """A deadline test: the schema would take minutes to compile, the limit is 5 s; after the
    400 the idle server spends well under half a core over 3 s (a compile left running spends
    a whole one)."""
    s = send(srv.port, guided(slow_to_compile("cpu")))
    health_open = False
    while not answered(s):
        health_open |= httpx.get(srv.base + "/health", timeout=120).status_code == 200 and not (
            answered(s)
        )
        time.sleep(0.05)
    status, body, _ = _answer(s, 0.0)
    s.close()
    assert status == 400 and f"did not compile within {LIMIT_S} s" in body["error"]["message"]
    assert health_open
    before = server_cpu_s(srv)
    time.sleep(3)
    assert server_cpu_s(srv) - before < 1.5, "the refused compile is still running"
    [timeout] = [r for r in receipts(srv, "grammar.compile") if r["outcome"] == "timeout"]
    assert not psutil.pid_exists(timeout["worker"])
    killed = [r for r in receipts(srv, "grammar.worker") if r["action"] == "killed"]
    assert [k["pid"] for k in killed] == [timeout["worker"]]


def test_with_every_compile_worker_busy_another_compile_is_refused_with_retry_after(srv):
    """One worker, no line: of two slow compiles sent at once, one compiles (and is ended at
    its limit) and the other is refused at once as load, saying when to try again."""
    results: dict[str, httpx.Response] = {}

    def post(tag: str) -> None:
        # minutes to compile, as the deadline test's: far past the limit on any machine (an
        # enum of 11 s here compiled within 5 s on a quieter one)
        body = orjson.loads(guided(slow_to_compile(tag)).partition(b"\r\n\r\n")[2])
        results[tag] = httpx.post(srv.base + "/v1/completions", json=body, timeout=300)

    threads = [threading.Thread(target=post, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    statuses = sorted(r.status_code for r in results.values())
    assert statuses == [400, 503], {k: r.text[:200] for k, r in results.items()}
    [busy] = [r for r in results.values() if r.status_code == 503]
    retry = int(busy.headers["retry-after"])
    assert 1 <= retry <= LIMIT_S and "--grammar-workers" in busy.json()["error"]["message"]
    [receipt] = [r for r in receipts(srv, "grammar.compile") if r["outcome"] == "busy"]
    assert (receipt["running"], receipt["waiting"], receipt["retry_after_s"]) == (1, 0, retry)
