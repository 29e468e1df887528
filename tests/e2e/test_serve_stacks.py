"""``SIGUSR1`` to a serving process writes its threads' stacks to the server's output, and it
serves on: a hang can say where each process waits without a debugger."""

from __future__ import annotations

import os
import signal

import httpx

from tests.e2e.server_proc import ServerProc


def test_sigusr1_writes_each_process_stack_and_serving_goes_on(tiny_model_dir, tmp_path):
    srv = ServerProc(tmp_path / "boot.jsonl", "--model", tiny_model_dir)
    try:
        for pid in (srv.proc.pid, srv.scheduler_pid()):
            os.kill(pid, signal.SIGUSR1)
        body = {"prompt": "hello", "max_tokens": 2}
        r = httpx.post(srv.base + "/v1/completions", json=body, timeout=300)
    finally:
        code, out = srv.stop()
    assert r.status_code == 200 and code == 0, out
    # each process's dump names the thread it interrupted and the frames under it: the
    # scheduler's loop, the frontend's server
    assert out.count("(most recent call first)") >= 2, out
    assert "scheduler_proc.py" in out and "engine_app.py" in out, out
