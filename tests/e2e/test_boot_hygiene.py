"""Boot hygiene of `engine serve` (a tiny model) on loopback: a second instance on a held port,
pid file or boot log is refused at once naming the PID that holds it; a stale pid file is taken
over with a receipt; boot.start says where the boot came from; boot.ready means serving; the
server binds loopback; ATTEST_API_KEY guards /v1 and /admin."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.server_proc import ServerProc, free_port

KEY = "hygiene-key-1"
REFUSED = 75  # EX_TEMPFAIL


def receipts(path) -> list[dict]:
    return [orjson.loads(x) for x in Path(path).read_bytes().splitlines() if x.startswith(b"{")]


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def serve(model: str, *args: str) -> subprocess.CompletedProcess:
    """A second `engine serve`, run to its end. "At once" is what it printed (no model loaded,
    no pool built), not its seconds: a busy machine takes longer to start any Python."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.engine_app",
            "serve",
            "--model",
            model,
            "--kv-tokens",
            "1024",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def live(tiny_model_dir, tmp_path_factory):
    """A serving instance that took over a dead predecessor's pid file, its key from the
    environment."""
    d = tmp_path_factory.mktemp("hygiene")
    pid_file = d / "attest.pid"
    gone = dead_pid()
    pid_file.write_text(f"{gone}\n")
    srv = ServerProc(
        d / "boot.jsonl",
        "--model",
        tiny_model_dir,
        "--kv-tokens",
        "1024",
        "--pid-file",
        str(pid_file),
        env={"ATTEST_API_KEY": KEY},
    )
    srv.pid_file, srv.predecessor = pid_file, gone
    yield srv
    srv.stop()


def test_a_held_port_is_refused_at_once_naming_the_port_and_the_pid(live, tiny_model_dir, tmp_path):
    log = tmp_path / "second.jsonl"
    done = serve(tiny_model_dir, "--port", str(live.port), "--log-file", str(log))
    assert done.returncode == REFUSED, done.stderr
    assert f"port {live.port}" in done.stderr and f"pid {live.proc.pid}" in done.stderr
    assert "Attest serving" not in done.stdout  # no model was loaded, no pool built
    assert not log.exists() and not Path(f"{log}.pid").exists()  # and nothing left behind


def test_a_log_held_by_a_live_boot_is_refused_and_left_as_it_was(live, tiny_model_dir, tmp_path):
    before = receipts(live.log_file)
    done = serve(
        tiny_model_dir,
        "--port",
        str(free_port()),
        "--log-file",
        str(live.log_file),
        "--pid-file",
        str(tmp_path / "second.pid"),
    )
    assert done.returncode == REFUSED, done.stderr
    assert str(live.log_file) in done.stderr and f"pid {live.proc.pid}" in done.stderr
    after = receipts(live.log_file)
    assert after[: len(before)] == before
    assert {r["boot"] for r in after} == {before[0]["boot"]}  # no second boot appended


def test_a_held_pid_file_is_refused_naming_the_pid(live, tiny_model_dir, tmp_path):
    done = serve(
        tiny_model_dir,
        "--port",
        str(free_port()),
        "--log-file",
        str(tmp_path / "second.jsonl"),
        "--pid-file",
        str(live.pid_file),
    )
    assert done.returncode == REFUSED, done.stderr
    assert str(live.pid_file) in done.stderr and f"pid {live.proc.pid}" in done.stderr
    assert live.pid_file.read_text() == f"{live.proc.pid}\n"


def test_the_stale_pid_file_was_taken_over_with_a_receipt(live):
    recs = receipts(live.log_file)
    (stale,) = [r for r in recs if r["event"] == "boot.stale_pid"]
    assert (stale["path"], stale["pid"], stale["running"]) == (
        str(live.pid_file),
        live.predecessor,
        False,
    )
    assert live.pid_file.read_text() == f"{live.proc.pid}\n"


def test_boot_start_says_which_process_host_command_and_versions(live):
    start = receipts(live.log_file)[0]
    assert start["event"] == "boot.start"
    assert (start["pid"], start["ppid"]) == (live.scheduler_pid(), live.proc.pid)
    assert start["host"] == socket.gethostname()
    assert start["argv"][-4:] == ["--kv-tokens", "1024", "--pid-file", str(live.pid_file)]
    assert {"engine", "python", "torch", "device"} <= set(start["versions"])


def test_boot_ready_names_the_port_it_serves(live):
    (ready,) = [r for r in receipts(live.log_file) if r["event"] == "boot.ready"]
    assert (ready["host"], ready["port"]) == ("127.0.0.1", live.port)


def test_it_binds_loopback_unless_told_otherwise(live):
    listening = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and int(local.split(":")[1], 16) == live.port:
            listening.append(local.split(":")[0])
    assert listening == ["0100007F"]  # 127.0.0.1, and nothing else


def test_the_key_from_the_environment_guards_v1_and_admin_not_health(live):
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(live.base + "/v1/models", timeout=60).status_code == 401
    assert httpx.get(live.base + "/v1/models", headers=auth, timeout=60).status_code == 200
    assert httpx.post(live.base + "/admin/anything", timeout=60).status_code == 401
    assert httpx.post(live.base + "/admin/anything", headers=auth, timeout=60).status_code != 401
    assert httpx.get(live.base + "/health", timeout=60).status_code == 200


def test_an_orderly_stop_releases_the_pid_file(live):
    code, out = live.stop()
    assert code == 0, out
    assert not live.pid_file.exists()


def test_boot_ready_is_written_only_once_the_port_answers(tiny_model_dir, tmp_path):
    log, port = tmp_path / "boot.jsonl", free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.engine_app",
            "serve",
            "--model",
            tiny_model_dir,
            "--kv-tokens",
            "1024",
            "--port",
            str(port),
            "--log-file",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (log.exists() and b'"boot.ready"' in log.read_bytes()):
            assert proc.poll() is None and time.monotonic() < deadline, "never ready"
            time.sleep(0.001)
        # the moment the log says ready, a client is served (not refused, not left waiting)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert conn.recv(64).startswith(b"HTTP/1.1 200 ")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
