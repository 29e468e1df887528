"""Faults from outside against a real `engine serve` (a tiny model) on loopback: the scheduler
process killed (SIGKILL) or stopped (SIGSTOP) under load, SIGTERM under heavy load with a bounded
drain, and a trace collector that never answers or refuses. Each ends with the receipts read
back: what every request became, and what the auditor says."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import orjson
import pytest

from tests.e2e.server_proc import ServerProc
from tests.tiny_model import make_tiny_model

LONG = {"prompt": [5, 6, 7, 8], "max_tokens": 3000, "ignore_eos": True}
SHORT = {"prompt": [9, 10, 11], "max_tokens": 30, "ignore_eos": True}
# one torch thread: two servers' thread pools fighting over a shared machine's cores turn
# milliseconds into seconds, which the timing bounds here would mistake for the fault
ONE = ("--threads", "1")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A tiny model with room for long generations (4,096 positions)."""
    return str(make_tiny_model(tmp_path_factory.mktemp("chaos-model"), max_position=16384))


def receipts(path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.startswith(b"{")]


def audit(log, spec: str) -> tuple[int, dict[str, str]]:
    done = subprocess.run(
        [sys.executable, "-m", "cli.audit_app", "verdict", str(log), "--spec", spec, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    claims = orjson.loads(done.stdout)["specs"][0]["claims"]
    return done.returncode, {c["claim"]: c["verdict"] for c in claims}


def set_once_written(log, marker: bytes, event: threading.Event, limit: float = 300) -> None:
    """Set ``event`` once ``marker`` is in the file ``log`` (or ``event`` is set already)."""
    deadline = time.monotonic() + limit
    while not event.is_set() and time.monotonic() < deadline:
        if log.exists() and marker in log.read_bytes():
            break
        time.sleep(0.01)
    event.set()


def every_request_ends(recs: list[dict]) -> None:
    received = {r["rid"] for r in recs if r["event"] == "request.received"}
    ends = Counter(r["rid"] for r in recs if r["event"] in ("request.finish", "request.abort"))
    assert all(ends[rid] == 1 for rid in received), "a request without exactly one ending"
    assert all(n == 1 for n in ends.values()), "a request ended twice"
    # a request submitted just before the kill may never have been read by the scheduler: the
    # frontend still ends it (scheduler_died), though no request.received was written for it
    died = {
        r["rid"] for r in recs if r["event"] == "request.abort" and r["reason"] == "scheduler_died"
    }
    assert set(ends) - received <= died, "an ending for a request nobody sent"


class Client(threading.Thread):
    """One request in the background: its status, its SSE data (streaming), and when it ended."""

    def __init__(
        self, base: str, body: dict, stream: bool, leave: threading.Event | None = None
    ) -> None:
        super().__init__(daemon=True)
        self.base, self.body, self.stream = base, {**body, "stream": stream}, stream
        self.leave = leave  # set: a streaming client hangs up at its next chunk
        self.first = threading.Event()  # a first token (streaming) or the answer
        self.status: int | None = None
        self.data: list[str] = []
        self.error: dict | None = None
        self.ended_at: float | None = None
        self.start()

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST", self.base + "/v1/completions", json=self.body, timeout=300
            ) as r:
                self.status = r.status_code
                if not self.stream or r.status_code != 200:
                    body = orjson.loads(r.read())
                    self.error = body.get("error")
                    self.data.append(body)
                for line in r.iter_lines() if self.stream and r.status_code == 200 else ():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunk = orjson.loads(line[6:])
                        self.error = chunk.get("error") or self.error
                        self.data.append(chunk)
                        self.first.set()
                    if self.leave is not None and self.leave.is_set():
                        break
        except httpx.HTTPError as e:
            self.error = {"message": f"transport: {e}"}
        finally:
            self.ended_at = time.monotonic()
            self.first.set()


def test_sigkill_of_the_scheduler_under_load_errors_every_request_and_audits_fail(model, tmp_path):
    log = tmp_path / "boot.jsonl"
    srv = ServerProc(log, "--model", model, "--kv-tokens", "8192", "--max-running", "8", *ONE)
    try:
        health = httpx.get(srv.base + "/health", timeout=60).json()
        assert health["scheduler_pid"] == srv.scheduler_pid()
        streams = [Client(srv.base, LONG, stream=True) for _ in range(5)]
        plain = [Client(srv.base, LONG, stream=False) for _ in range(3)]
        assert all(c.first.wait(300) for c in streams), "the load never started"
        assert all(c.ended_at is None for c in streams + plain), "the load ended before the kill"
        killed = time.monotonic()
        os.kill(health["scheduler_pid"], signal.SIGKILL)
        for c in streams + plain:
            c.join(120)
        # each hears it, by its own channel, at once: the bound is far below the clients' own
        # timeout (what a missed death would cost) and far above a busy machine's delays
        for c in streams + plain:
            assert c.ended_at - killed < 30, (c.stream, c.ended_at - killed)
            assert c.error and "scheduler" in c.error["message"], c.error
            assert c.status == (200 if c.stream else 503)  # a stream's headers were already sent
        code, out = srv.stop(signal.SIGCONT)  # it exits by itself
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    assert code == 1, out
    assert "was killed by SIGKILL" in out
    recs = receipts(log)
    stop = recs[-1]
    assert (stop["event"], stop["reason"]) == ("boot.stop", "scheduler_died")
    assert (stop["signal"], stop["exit_code"]) == ("SIGKILL", -9)
    lost = [r for r in recs if r["event"] == "request.abort" and r["reason"] == "scheduler_died"]
    assert len(lost) == stop["in_flight"] == 8
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))  # one unbroken log
    every_request_ends(recs)
    rc, claims = audit(log, "boot_health")
    assert rc == 1 and claims["stopped_in_order"] == "FAIL", claims


def test_sigterm_under_heavy_load_drains_within_its_bound_with_receipts(model, tmp_path):
    log = tmp_path / "boot.jsonl"
    drain = 10.0  # roomy: the medium requests must finish within it on a loaded machine
    # long enough to be in flight when the signal lands, short enough to finish within the drain
    medium = {**SHORT, "max_tokens": 100}
    # far more tokens than any machine decodes in the drain: on a fast CPU thirteen requests of
    # 3000 tokens all finished within its 10 s, and the abort at the deadline went untested
    longer = {**LONG, "max_tokens": 12000}
    # a pool all 25 requests fit at full length: retracted under memory pressure, the client
    # that is to hang up would wait for chunks that never come, and never hang up
    srv = ServerProc(
        log,
        "--model",
        model,
        "--kv-tokens",
        "163840",
        "--max-running",
        "32",
        "--drain-timeout",
        str(drain),
        *ONE,
    )
    try:
        longs = [Client(srv.base, longer, stream=i % 2 == 0) for i in range(12)]
        leave = threading.Event()  # a client that hangs up while the server drains
        leaver = Client(srv.base, longer, stream=True, leave=leave)
        assert all(c.first.wait(300) for c in [*longs[::2], leaver]), "the load never started"
        shorts = [Client(srv.base, medium, stream=i % 2 == 0) for i in range(12)]
        # every request is in the server before the stop: on a busy machine a client thread
        # that had not connected yet was refused (the socket closes when the drain begins),
        # which is right for the server and no test of its drain
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.read_bytes().count(b'"request.received"') >= len(longs) + 1 + len(shorts):
                break
            time.sleep(0.05)
        # it hangs up once the drain has begun (its receipt is written), not after a pause that
        # a busy machine could stretch past the drain's end
        threading.Thread(target=set_once_written, args=(log, b'"boot.drain"', leave)).start()
        code, out = srv.stop(signal.SIGTERM)
        late = Client(srv.base, SHORT, stream=False)  # after the stop: refused or unreachable
        late.join(60)
    finally:
        leave.set()  # the watcher's wait ends too
        if srv.proc.poll() is None:
            srv.proc.kill()
    assert code == 0, out
    for c in longs + shorts:
        c.join(60)
        assert not c.is_alive()
        if c.error:  # aborted at the deadline: a clean 503 naming the stop
            assert "shutting down" in c.error["message"], c.error
        else:  # or finished while the server drained
            assert c.status == 200
    ended = [c.status for c in longs]
    assert any(c.error for c in longs), f"every 12000-token request finished in the drain: {ended}"
    short = [c.error and c.error["message"] for c in shorts]
    assert any(not c.error for c in shorts), f"no 100-token request finished in the drain: {short}"
    assert late.error is not None
    recs = receipts(log)
    (begin,) = [r for r in recs if r["event"] == "boot.drain"]
    assert (begin["reason"], begin["timeout_s"]) == ("sigterm", drain)
    stop = recs[-1]
    assert (stop["event"], stop["reason"]) == ("boot.stop", "sigterm")
    # the drain's length by the scheduler's own receipts: from its start to the stop, one step
    # past the deadline; the longs alone would run on for tens of seconds more. Timed from the
    # client, it would also hold the processes' exit, which a busy machine stretches
    took = stop["ts"] - begin["ts"]
    assert drain - 0.01 <= took < drain + 8, f"{took:.1f} s for a {drain} s drain"
    after = recs[recs.index(begin) :]
    aborted = [r for r in after if r["event"] == "request.abort"]
    finished = [r for r in after if r["event"] == "request.finish"]
    # the one that left during the drain is aborted as such, not as part of the stop
    (left,) = [r for r in aborted if r["rid"] == leaver.data[0]["id"]]
    assert left["reason"] == "client_disconnect"
    stopped = [r for r in aborted if r is not left]
    assert {r["reason"] for r in stopped} == {"sigterm"} and stop["in_flight"] == len(stopped)
    assert stop["drained"] == len(finished) + 1
    # the drain let medium requests finish; on busy cores all of them can finish before the
    # signal lands (a fresh clone beside two spinning processes: none in flight at the drain),
    # and then it had none to let finish
    early = [r for r in recs[: recs.index(begin)] if r["event"] == "request.finish"]
    assert finished or len(early) == len(shorts), (len(early), len(finished))
    every_request_ends(recs)
    for spec in ("boot_health", "no_request_lost"):
        rc, claims = audit(log, spec)
        assert rc == 0, (spec, claims)


def test_a_frozen_scheduler_turns_health_to_503_naming_the_stall(model, tmp_path):
    # one request at a time: the big ones below then share one prefill through the prefix cache.
    # The stall limit is ten heartbeats (0.5 s apart): a busy machine that delays a beat never
    # reaches it, and a stopped scheduler (which never beats) always does
    stall = 5
    srv = ServerProc(
        tmp_path / "boot.jsonl",
        "--model",
        model,
        "--kv-tokens",
        "8192",
        "--max-running",
        "1",
        "--stall-timeout",
        str(stall),
        *ONE,
    )
    # 8 choices of 4,000 tokens: ~100 KB to send the scheduler
    big = {"prompt": [256 + i * 7 % 64 for i in range(4000)], "max_tokens": 1, "n": 8}

    def health() -> httpx.Response:
        """/health, which never waits on the scheduler: a stopped one included."""
        t0 = time.monotonic()
        r = httpx.get(srv.base + "/health", timeout=60)
        assert time.monotonic() - t0 < 20, "/health waited on the scheduler"
        return r

    try:
        # idle, the scheduler still beats: the heartbeat's age falls back, again and again
        ages, deadline = [], time.monotonic() + 120
        while sum(b < a for a, b in zip(ages, ages[1:])) < 3:
            assert time.monotonic() < deadline, f"no heartbeat while idle: {ages}"
            ok = health()
            assert ok.status_code == 200, ok.json()
            ages.append(ok.json()["heartbeat_age_s"])
            time.sleep(0.1)
        pid = ok.json()["scheduler_pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            # ten of them overfill the pipe's buffers (about 400 KB)
            waiting = [Client(srv.base, big, stream=False) for _ in range(10)]
            deadline = time.monotonic() + 300  # past the stall limit, however slow the machine
            while (frozen := health()).status_code == 200:
                assert time.monotonic() < deadline, "a stopped scheduler never counted as stalled"
                time.sleep(0.2)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert frozen.status_code == 503, frozen.text
        body = frozen.json()
        assert "stalled" in body["error"]["message"] and f"pid {pid}" in body["error"]["message"]
        assert body["heartbeat_age_s"] > stall and body["scheduler_pid"] == pid
        deadline = time.monotonic() + 120
        while health().status_code != 200:
            assert time.monotonic() < deadline, "health never recovered after SIGCONT"
            time.sleep(0.1)
        for c in waiting:  # held while it was stopped, served once it went on
            c.join(300)
            assert c.status == 200, c.error
        r = httpx.post(srv.base + "/v1/completions", json=SHORT, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        code, out = srv.stop()
    assert code == 0, out
    assert f"scheduler process (pid {pid}) has not been heard from" in out
    assert f"scheduler process (pid {pid}) is heard from again" in out


class _BlackHole:
    """A collector that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            while True:
                self.held.append(self.sock.accept()[0])
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for s in self.held:
            s.close()


class _Refuser:
    """A collector that refuses every export (HTTP 503, the retryable refusal)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server API)
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(503)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


# an export's timeout far past any loaded machine's delay: waiting on it cannot pass for load
EXPORT_S = 240


@pytest.mark.parametrize("collector", [_BlackHole, _Refuser], ids=["never_answers", "refuses"])
def test_a_collector_that_hangs_or_refuses_costs_no_request(model, tmp_path, collector):
    col = collector()
    srv = ServerProc(
        tmp_path / "boot.jsonl",
        "--model",
        model,
        "--kv-tokens",
        "1024",
        "--otlp-endpoint",
        col.url,
        *ONE,
        env={
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_EXPORTER_OTLP_TIMEOUT": str(EXPORT_S),
            "OTEL_BSP_EXPORT_TIMEOUT": str(EXPORT_S * 1000),
        },
    )
    try:
        for i in range(6):
            t0 = time.monotonic()
            r = httpx.post(
                srv.base + "/v1/completions", json={**SHORT, "prompt": [5, 6 + i]}, timeout=300
            )
            assert r.status_code == 200, r.text
            # an export holds on for its timeout (never answers) or 1, 2, 4 ... s between
            # retries up to it (refuses): a request that waited on one would take that long
            assert time.monotonic() - t0 < EXPORT_S / 2, "a request waited on the collector"
            time.sleep(0.2)  # several export batches, each stuck or refused
        assert httpx.get(srv.base + "/health", timeout=60).status_code == 200
    finally:
        code, out = srv.stop()
        col.close()
    assert code == 0, out
    # a collector that held up the exit shows as the frontend's own limit (its drain + 10 s)
    # running out on the scheduler, whatever the machine's speed: no clock of ours needed
    assert "did not stop in time" not in out, out
