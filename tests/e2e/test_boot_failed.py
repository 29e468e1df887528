"""`engine serve` (a tiny model) that fails after its boot log opened: the log ends with
`boot.stop` `boot_failed`, the exit code the process exits with and the message it printed, and
`boot_health` FAILs it naming that cause (never UNDECIDED, as a log that only began would be)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from tests.e2e.audit_cli import audit
from tests.e2e.server_proc import free_port

BAD_TP = "tp 3 does not divide the model's 4 attention heads"


def receipts(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.startswith(b"{")]


def test_a_bad_tp_ends_the_log_with_boot_failed_the_exit_code_and_the_message(
    tiny_model_dir, tmp_path
):
    log = tmp_path / "boot.jsonl"
    # the tiny model's 4 heads do not split over 3 ranks: known once its weights are read,
    # after boot.start (the bound is a hang's, not a speed's)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.engine_app",
            "serve",
            "--model",
            tiny_model_dir,
            "--kv-tokens",
            "1024",
            "--tp",
            "3",
            "--port",
            str(free_port()),
            "--log-file",
            str(log),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr
    assert BAD_TP in done.stderr
    recs = receipts(log)
    start, *_, stop = recs
    before = recs[-2]  # the failed boot's last receipt (boot.start itself, here)
    assert start["event"] == "boot.start"
    assert stop["event"] == "boot.stop" and stop["reason"] == "boot_failed"
    assert (stop["boot"], stop["rank"], stop["seq"]) == (start["boot"], 0, before["seq"] + 1)
    assert stop["exit_code"] == done.returncode and BAD_TP in stop["error"]
    assert stop["in_flight"] == 0
    assert not Path(f"{log}.pid").exists()  # released as any exit releases it

    r = audit("verdict", str(log), "--spec", "boot_health", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    claims = {c["claim"]: c for c in orjson.loads(r.stdout)["specs"][0]["claims"]}
    stopped = claims["stopped_in_order"]
    assert stopped["verdict"] == "FAIL"
    assert "boot_failed" in stopped["why"] and BAD_TP in stopped["why"]
    assert "exit_code 2" in stopped["why"]
