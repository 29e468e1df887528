"""What `engine serve` refuses before anything heavy: a port, a pid file or a boot log that a
live process holds (naming its PID), and a stale pid file it takes over, saying whose it was."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys

import pytest

from engine.server.boot_guard import BootRefused, PidFile, listen, lock_log
from tests.e2e.server_proc import free_port


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_held_port_is_refused_naming_the_port_and_the_pid_that_holds_it():
    held = listen("127.0.0.1", free_port())
    port = held.getsockname()[1]
    try:
        with pytest.raises(BootRefused) as e:
            listen("127.0.0.1", port)
        assert f"port {port}" in str(e.value) and f"pid {os.getpid()}" in str(e.value)
    finally:
        held.close()
    listen("127.0.0.1", port).close()  # free again: taken at once


def test_the_listener_is_bound_and_listening_before_it_is_returned():
    sock = listen("127.0.0.1", 0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
        with socket.create_connection(sock.getsockname(), timeout=2):
            pass  # the kernel accepts into the backlog: the port is held, not just named
    finally:
        sock.close()


def test_a_log_held_by_a_live_boot_is_refused_naming_its_pid(tmp_path):
    log = tmp_path / "boot.jsonl"
    log.write_bytes(b'{"event": "boot.start"}\n')
    held = lock_log(log)
    try:
        with pytest.raises(BootRefused) as e:
            lock_log(log)
        assert str(log) in str(e.value) and f"pid {os.getpid()}" in str(e.value)
    finally:
        held.close()
    assert log.read_bytes() == b'{"event": "boot.start"}\n'  # the refusal wrote nothing
    lock_log(log).close()


def test_a_pid_file_of_a_live_process_is_refused_naming_the_pid(tmp_path):
    path = tmp_path / "attest.pid"
    mine, stale = PidFile.claim(path)
    assert stale is None and path.read_text() == f"{os.getpid()}\n"
    try:
        with pytest.raises(BootRefused) as e:
            PidFile.claim(path)
        assert str(path) in str(e.value) and f"pid {os.getpid()}" in str(e.value)
        assert path.read_text() == f"{os.getpid()}\n"
    finally:
        mine.release()
    assert not path.exists()  # an orderly exit leaves nothing behind


def test_a_stale_pid_file_of_a_dead_predecessor_is_taken_over_and_said(tmp_path):
    path = tmp_path / "attest.pid"
    gone = dead_pid()
    path.write_text(f"{gone}\n")  # its process died without removing it (SIGKILL, power loss)
    mine, stale = PidFile.claim(path)
    try:
        assert stale is not None
        assert (stale.path, stale.pid, stale.running) == (str(path), gone, False)
        assert path.read_text() == f"{os.getpid()}\n"
    finally:
        mine.release()


def test_an_unlocked_pid_file_naming_a_live_process_is_stale_and_says_the_pid_was_reused(
    tmp_path,
):
    path = tmp_path / "attest.pid"
    path.write_text(f"{os.getppid()}\n")  # a live process that never locked it: not an engine
    mine, stale = PidFile.claim(path)
    mine.release()
    assert stale is not None and stale.pid == os.getppid() and stale.running


def test_a_conflict_shows_the_holders_command_line_in_whole_arguments():
    """The refusal names the process that holds the port by its command line, shortened at
    whole arguments and saying how many it left out: cut at a fixed width, ``--kv-tokens 8192``
    once read ``--kv-tokens 819``."""
    port = free_port()
    hold = (
        "import os, socket, sys, time; s = socket.socket(); "
        "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print(1, flush=True); time.sleep(120)"
    )
    head = ["python", "-c", "exec(__import__('os').environ['HOLD'])", str(port)]
    # as the width cut read it (arguments joined by spaces): its 120th character ends in "819"
    filler = "--log-file=/var/log/attest/" + "b" * (104 - len(" ".join(head) + " ") - 27)
    argv = [*head, filler, "--kv-tokens", "8192", "--served-model-name", "smol", "--tp", "1"]
    assert " ".join(argv)[:120].endswith("--kv-tokens 819")
    p = subprocess.Popen(
        argv,
        executable=sys.executable,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOLD": hold},
    )
    try:
        assert p.stdout.readline().strip() == "1"  # it listens
        with pytest.raises(BootRefused) as e:
            listen("127.0.0.1", port)
    finally:
        p.kill()
        p.wait()
    assert "--kv-tokens 819)" not in str(e.value)
    m = re.search(rf"pid {p.pid} \((.*)\); stop it", str(e.value))
    assert m, str(e.value)
    shown, _, left = m[1].partition(" ... (")
    args = shlex.split(shown)
    assert args == argv[: len(args)], str(e.value)
    assert left == f"{len(argv) - len(args)} more arguments)", str(e.value)
