"""A stop signal while `engine serve` starts (its boot log begun, its model still loading) is an
orderly stop like any other: `boot.stop` with the signal's reason, exit 0, the scheduler process
gone with it, the pid file removed.

The load is held, not raced: the tiny model's weights file is a FIFO nobody writes, so the
scheduler process waits in its open from just after `boot.start` for as long as the test
needs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import psutil
import pytest

from tests.e2e.audit_cli import audit
from tests.e2e.server_proc import free_port

WAIT_S = 300  # an upper bound on a wait for something quick (a hang's, not a speed's)


def receipts(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.startswith(b"{")]


def held_model(tiny_model_dir: str, folder: Path) -> Path:
    """The tiny model with a weights file whose open never returns (a FIFO without a writer)."""
    folder.mkdir()
    for f in Path(tiny_model_dir).iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    os.mkfifo(folder / "model.safetensors")
    return folder


def wait_for_boot_start(proc: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode} before boot.start"
        if log.exists() and (recs := receipts(log)):
            return recs[0]
        time.sleep(0.05)
    raise AssertionError(f"no boot.start in {WAIT_S} s")


def gone(pid: int) -> bool:
    """The process has exited (a zombie not reaped yet has too)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_while_the_model_loads_stops_in_order(tiny_model_dir, tmp_path, sig):
    model, log = held_model(tiny_model_dir, tmp_path / "model"), tmp_path / "boot.jsonl"
    printed = tmp_path / "out.txt"  # a file, not a pipe: an orphan holding a pipe never ends it
    with printed.open("w") as out_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.engine_app",
                "serve",
                "--model",
                str(model),
                "--kv-tokens",
                "1024",
                "--port",
                str(free_port()),
                "--log-file",
                str(log),
            ],
            stdout=out_file,
            stderr=subprocess.STDOUT,
        )
    scheduler = None
    try:
        start = wait_for_boot_start(proc, log)
        assert start["event"] == "boot.start"
        scheduler = start["pid"]  # the scheduler process wrote it, and waits on the weights
        assert scheduler != proc.pid and not gone(scheduler)
        proc.send_signal(sig)
        proc.wait(WAIT_S)
        out = printed.read_text()
        assert proc.returncode == 0, out
        assert "Traceback" not in out, out
        stop = receipts(log)[-1]
        assert stop["event"] == "boot.stop", stop
        assert stop["reason"] == signal.Signals(sig).name.lower() and stop["in_flight"] == 0
        assert (stop["boot"], stop["rank"]) == (start["boot"], 0)
        assert not Path(f"{log}.pid").exists()
        deadline = time.monotonic() + WAIT_S  # gone by the frontend's exit; a zombie reaped soon
        while not gone(scheduler) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(scheduler), f"scheduler process {scheduler} outlived its frontend"
    finally:
        proc.kill()
        if scheduler is not None and not gone(scheduler):
            os.kill(scheduler, signal.SIGKILL)  # an orphan the test must not leave behind
    # not a crash (a boot_failed stop FAILs here): the boot never served, so the auditor claims
    # nothing of how it served (its claims require boot.ready: UNDECIDED, never engaged)
    r = audit("verdict", str(log), "--spec", "boot_health", "--json")
    claims = {c["claim"]: c for c in orjson.loads(r.stdout)["specs"][0]["claims"]}
    assert claims["stopped_in_order"]["verdict"] == "UNDECIDED", claims["stopped_in_order"]
    assert "FAIL" not in {c["verdict"] for c in claims.values()}, claims
