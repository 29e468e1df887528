"""A scheduler that stands still is in its log: stopped (SIGSTOP) for 35 s under load, it writes
``scheduler.stall`` and ``scheduler.resume`` when it turns again, ``no_wedge`` FAILs the boot,
the clients whose deadline passed meanwhile got their 504s, and every ended request's latencies
count from when the frontend took it in, the stall included (a request handed in while it stood
too)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import orjson
import pytest

from tests.e2e.server_proc import Plain, ServerProc
from tests.tiny_model import make_tiny_model

DEADLINE = 20  # the request timeout: passes well inside the stall, on any machine
STOPPED = 35  # the stall: past the deadline and past no_wedge's 30 s
LONG = {"prompt": [5, 6, 7, 8], "max_tokens": 3000, "ignore_eos": True}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("stall-model"), max_position=4096))


def receipts(path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.startswith(b"{")]


def test_a_stopped_scheduler_writes_its_stall_and_fails_no_wedge(model, tmp_path):
    log = tmp_path / "boot.jsonl"
    srv = ServerProc(
        log,
        "--model",
        model,
        "--kv-tokens",
        "8192",
        "--threads",
        "1",
        "--request-timeout",
        str(DEADLINE),
        "--stall-timeout",
        "5",
    )
    try:
        running = [Plain(srv.base, LONG), Plain(srv.base, LONG)]
        deadline = time.monotonic() + 300
        while (h := httpx.get(srv.base + "/health", timeout=60).json())["running"] < 2:
            assert time.monotonic() < deadline, h
            time.sleep(0.05)
        pid = h["scheduler_pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            during = Plain(srv.base, LONG)  # handed in while it stands: it waits in the pipe
            time.sleep(STOPPED)
        finally:
            os.kill(pid, signal.SIGCONT)
        for c in (*running, during):
            c.join(300)
            assert (c.status, c.body["error"]["code"]) == (504, 504), c.body
    finally:
        code, out = srv.stop()
    assert code == 0, out
    recs = receipts(log)
    (stall,) = [r for r in recs if r["event"] == "scheduler.stall"]
    (resume,) = [r for r in recs if r["event"] == "scheduler.resume"]
    assert (stall["running"], stall["limit_s"]) == (2, 5), stall
    assert resume["stalled_s"] >= STOPPED and resume["arrived"] == 1, resume
    assert stall["seq"] < resume["seq"]
    received = {r["rid"]: r for r in recs if r["event"] == "request.received"}
    aborts = [r for r in recs if r["event"] == "request.abort"]
    assert len(aborts) == 3 and {a["reason"] for a in aborts} == {"deadline"}, aborts
    for a in aborts:  # from the arrival the frontend saw, the stall included
        assert a["e2e_s"] >= DEADLINE, a
        assert received[a["rid"]]["arrived"] <= received[a["rid"]]["ts"]
    late = [a for a in aborts if received[a["rid"]]["seq"] > stall["seq"]]
    assert len(late) == 1  # the one handed in during the stall, seen only after it
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.audit_app",
            "verdict",
            str(log),
            "--spec",
            "boot_health",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    claims = {c["claim"]: c for c in orjson.loads(done.stdout)["specs"][0]["claims"]}
    assert done.returncode == 1, done.stdout
    assert claims["no_wedge"]["verdict"] == "FAIL", claims["no_wedge"]
    assert "the scheduler stood still for" in claims["no_wedge"]["why"]
