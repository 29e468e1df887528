"""`engine window NAME`: boot, load, stop and verdict in one command, as an operator runs it —
on the tiny model in every test run, every shipped window on the default model with -m slow."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import orjson
import pytest

from tests.conftest import requires_default_model


def window(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.engine_app", "window", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def receipts(path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.startswith(b"{")]


def test_admission_park_window_passes_and_leaves_its_log(tiny_model_dir, tmp_path):
    r = window("admission_park", "--model", tiny_model_dir, "--out-dir", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "overall: PASS" in r.stdout and "answers {200: 32}" in r.stdout
    (log,) = tmp_path.glob("admission_park-*-window.jsonl")
    events = [x["event"] for x in receipts(log)]
    assert events.count("request.received") == 32 and "admission.park" in events
    assert events[-1] == "boot.stop" and str(log) in r.stdout


def test_relief_ladder_with_its_control_boot(tiny_model_dir, tmp_path):
    r = window("relief_ladder", "--control", "--model", tiny_model_dir, "--out-dir", str(tmp_path))
    assert r.returncode in (0, 1), r.stdout + r.stderr
    (log,) = tmp_path.glob("relief_ladder-*-window.jsonl")
    (control,) = tmp_path.glob("relief_ladder-*-control.jsonl")
    on, off = ([x["event"] for x in receipts(p)] for p in (log, control))
    assert "relief.engage" in on and "relief.engage" not in off  # the control is the ladder off
    # the ladder's throttle and retract rungs fund the chunks the control parks
    assert on.count("admission.park") < off.count("admission.park")
    assert r.returncode == 0 and "overall: PASS" in r.stdout, r.stdout
    assert str(control) in r.stdout


def test_a_killed_window_takes_its_engine_with_it(tiny_model_dir, tmp_path):
    """SIGKILL of `engine window` mid-load cannot run its cleanup; the engine it booted must not
    live on as an orphan holding a port and the CPU. It is stopped in order (SIGTERM: it drains
    and writes boot.stop)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.engine_app",
            "window",
            "boot_health",
            "--model",
            tiny_model_dir,
            "--out-dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not any(b"boot.ready" in p.read_bytes() for p in tmp_path.glob("*.jsonl")):
            assert proc.poll() is None and time.monotonic() < deadline, "the engine never came up"
            time.sleep(0.2)
        engines = [pid for pid in pids_mentioning(str(tmp_path)) if pid != proc.pid]
        assert engines, "no engine process found"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 300
        while (alive := [p for p in engines if os.path.exists(f"/proc/{p}")]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever is left of the group
            os.killpg(proc.pid, signal.SIGKILL)
    assert not alive, f"engine processes outlived their window: {alive}"
    (log,) = tmp_path.glob("boot_health-*-window.jsonl")
    assert receipts(log)[-1]["event"] == "boot.stop"


def pids_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (zombies have none)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry))
    return found


def test_a_regime_not_reached_is_undecided_never_pass(tiny_model_dir, tmp_path):
    # a pool that holds every request at once: nothing parks, so the window cannot be judged
    r = window(
        "admission_park",
        "--model",
        tiny_model_dir,
        "--out-dir",
        str(tmp_path),
        "--flag=--kv-tokens=8192",
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "overall: UNDECIDED" in r.stdout and "PASS" not in r.stdout.split("parks_seen")[1][:40]


def test_a_window_without_a_recipe_is_a_usage_error(tmp_path):
    r = window("sglang_pressure", "--out-dir", str(tmp_path))
    assert r.returncode == 64 and "no [regime.load] recipe" in r.stderr


def test_an_engine_that_cannot_start_is_said_not_judged(tiny_model_dir, tmp_path):
    r = window(
        "boot_health",
        "--model",
        tiny_model_dir,
        "--out-dir",
        str(tmp_path),
        "--flag=--chunk-tokens=0",
    )
    assert r.returncode == 69, r.stdout + r.stderr
    assert "the engine exited" in r.stderr and "overall" not in r.stdout


@pytest.mark.slow
@requires_default_model
@pytest.mark.parametrize(
    "name",
    ["boot_health", "no_request_lost", "admission_park", "eviction_honesty", "group_agreement"],
)
def test_every_shipped_window_passes_on_the_default_model(name, tmp_path):
    r = window(name, "--out-dir", str(tmp_path), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    # the regime was reached: no claim passed because its mechanism never ran (one rank aside)
    assert "no retract seen" not in r.stdout and "never reached" not in r.stdout, r.stdout


@pytest.mark.slow
@requires_default_model
def test_the_speculation_window_passes_against_its_control(tmp_path):
    """Prompt lookup in a tight pool, and the same load with it off: the same answers."""
    r = window("speculation", "--control", "--out-dir", str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "control log:" in r.stdout


def test_checkpoint_durability_boots_twice_on_one_store_and_passes(tiny_model_dir, tmp_path):
    """Two boots on one store in the window's folder: the first checkpoints three lanes (and a
    branch), the second continues them from the store; both logs judged together."""
    r = window("checkpoint_durability", "--model", tiny_model_dir, "--out-dir", str(tmp_path))
    assert r.returncode == 0 and "overall: PASS" in r.stdout, r.stdout + r.stderr
    one, two = (next(tmp_path.glob(f"checkpoint_durability-*-boot{i}.jsonl")) for i in (1, 2))
    made = [x["id"] for x in receipts(one) if x["event"] == "checkpoint.create"]
    found = [x["id"] for x in receipts(two) if x["event"] == "checkpoint.found"]
    assert sorted(made) == sorted(found) == ["lane-0", "lane-0-branch", "lane-1", "lane-2"]
    assert any(x["event"] == "store.load" and x["pages"] for x in receipts(two))
    assert "answers {200: 7}" in r.stdout and "answers {200: 3}" in r.stdout
