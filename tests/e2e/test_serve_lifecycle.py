"""How `engine serve` ends: in order on SIGTERM/SIGINT (exit 0, boot.stop), loudly and promptly
when its scheduler process dies (503s naming the reason, exit 1). Never a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import orjson
import pytest

from tests.conftest import requires_default_model
from tests.e2e.server_proc import ServerProc

pytestmark = requires_default_model
LONG = {"prompt": "Write a long story.", "max_tokens": 4000, "ignore_eos": True}


def receipts(path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


def in_scheduler(srv: ServerProc) -> int:
    """Requests the scheduler holds (running or waiting), by its last snapshot."""
    h = httpx.get(srv.base + "/health", timeout=60).json()
    return h["running"] + h["waiting"]


class Stream(threading.Thread):
    """A streaming client in the background: its SSE data lines, once the first has arrived."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base, self.lines, self.first = base, [], threading.Event()
        self.start()

    def run(self) -> None:
        with httpx.stream(
            "POST", self.base + "/v1/completions", json={**LONG, "stream": True}, timeout=60
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.lines.append(line[6:])
                    self.first.set()
        self.first.set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_in_order_with_boot_stop_and_exit_0(tmp_path, sig):
    log = tmp_path / "boot.jsonl"
    srv = ServerProc(log, "--kv-tokens", "8192")
    client = Stream(srv.base)
    assert client.first.wait(300)
    code, out = srv.stop(sig)  # never a hang: stop fails past its (roomy) limit
    assert code == 0, out
    client.join(60)
    assert not client.is_alive()
    assert client.lines[-1] == "[DONE]"
    error = orjson.loads(client.lines[-2])["error"]
    assert error["code"] == 503 and "shutting down" in error["message"]
    recs = receipts(log)
    name = signal.Signals(sig).name.lower()
    stop = recs[-1]
    assert stop["event"] == "boot.stop" and stop["reason"] == name and stop["in_flight"] == 1
    (abort,) = [r for r in recs if r["event"] == "request.abort"]
    assert abort["reason"] == name and abort["tokens"] < LONG["max_tokens"]
    assert {r["rid"] for r in recs if r["event"] == "request.received"} == {abort["rid"]}


def test_a_dead_scheduler_is_503_with_the_reason_then_exit_1(tmp_path):
    srv = ServerProc(tmp_path / "boot.jsonl", "--kv-tokens", "8192")
    try:
        stream = Stream(srv.base)
        assert stream.first.wait(300)
        answer = {}

        def plain() -> None:
            r = httpx.post(srv.base + "/v1/completions", json=LONG, timeout=300)
            answer["status"], answer["body"] = r.status_code, r.json()

        waiter = threading.Thread(target=plain, daemon=True)
        waiter.start()
        deadline = time.monotonic() + 300  # both requests are in the scheduler, however slow
        while in_scheduler(srv) < 2:
            assert time.monotonic() < deadline, "the requests never reached the scheduler"
            time.sleep(0.05)
        os.kill(srv.scheduler_pid(), signal.SIGKILL)
        waiter.join(120)
        stream.join(120)
        assert answer["status"] == 503
        assert "scheduler" in answer["body"]["error"]["message"]
        error = orjson.loads(stream.lines[-2])["error"]
        assert error["code"] == 503 and "scheduler" in error["message"]
        code, out = srv.stop(signal.SIGCONT)  # no signal needed: it exits by itself
        assert code == 1, out
        assert "scheduler process died" in out
        # the frontend wrote the death into the boot log, continuing the dead process's seq
        recs = [orjson.loads(line) for line in (tmp_path / "boot.jsonl").read_bytes().splitlines()]
        stop, before = recs[-1], recs[-2]
        assert stop["event"] == "boot.stop" and stop["reason"] == "scheduler_died"
        assert stop["in_flight"] == 2
        assert (stop["boot"], stop["rank"], stop["seq"]) == (
            before["boot"],
            before["rank"],
            before["seq"] + 1,
        )
        # ... so the auditor reads a crash, not a cut log
        verdict = subprocess.run(
            [
                sys.executable,
                "-m",
                "cli.audit_app",
                "verdict",
                str(tmp_path / "boot.jsonl"),
                "--spec",
                "boot_health",
                "--json",
            ],
            capture_output=True,
            text=True,
        )
        assert verdict.returncode == 1, verdict.stdout + verdict.stderr
        claims = {
            c["claim"]: c["verdict"] for c in orjson.loads(verdict.stdout)["specs"][0]["claims"]
        }
        assert claims["stopped_in_order"] == "FAIL"
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
