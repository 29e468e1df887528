"""The frontend's boot.stop after the scheduler process died: it continues the dead process's
boot, rank and seq, names the signal or exit code, ends each request that was in flight with an
abort, and survives a line the kill cut in half."""

from __future__ import annotations

import orjson

from engine.obs.death import write_death
from engine.obs.receipts import Receipts


def boot_log(path, n: int = 3) -> Receipts:
    r = Receipts(path)
    r.iter = 7
    for i in range(n):
        r.emit("request.received", rid=f"r-{i}", prompt_tokens=4, max_new_tokens=8)
    r.close()
    return r


def records(path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_the_stop_continues_the_dead_boot_and_its_seq(tmp_path):
    log = tmp_path / "boot.jsonl"
    dead = boot_log(log)
    assert write_death(log, "scheduler_died", ["r-1", "r-2"], exit_code=-9)
    *_, a1, a2, stop = records(log)
    assert stop["event"] == "boot.stop" and stop["reason"] == "scheduler_died"
    assert (stop["boot"], stop["rank"], stop["seq"], stop["iter"]) == (dead.boot, 0, 6, 7)
    assert stop["in_flight"] == 2
    assert stop["signal"] == "SIGKILL" and stop["exit_code"] == -9


def test_each_request_in_flight_ends_with_an_abort_before_the_stop(tmp_path):
    log = tmp_path / "boot.jsonl"
    boot_log(log)
    assert write_death(log, "scheduler_died", ["r-0", "r-2"], exit_code=1)
    *_, a0, a2, stop = records(log)
    assert [(a["event"], a["rid"], a["reason"]) for a in (a0, a2)] == [
        ("request.abort", "r-0", "scheduler_died"), ("request.abort", "r-2", "scheduler_died"),
    ]  # fmt: skip
    assert [a0["seq"], a2["seq"], stop["seq"]] == [4, 5, 6]
    assert stop["exit_code"] == 1 and "signal" not in stop


def test_a_request_whose_ending_the_dead_process_wrote_is_not_ended_twice(tmp_path):
    log = tmp_path / "boot.jsonl"
    r = boot_log(log)
    r2 = Receipts(log, boot=r.boot)
    r2.seq = r.seq
    r2.emit("request.finish", rid="r-1", reason="length", tokens=8)  # its output never arrived
    r2.close()
    assert write_death(log, "scheduler_died", ["r-0", "r-1"], exit_code=-9)
    *_, finish, abort, stop = records(log)
    assert finish["event"] == "request.finish" and finish["rid"] == "r-1"
    assert (abort["rid"], stop["in_flight"]) == ("r-0", 1)


def test_a_line_cut_by_the_kill_stays_apart_from_the_stop(tmp_path):
    log = tmp_path / "boot.jsonl"
    boot_log(log)
    with log.open("ab") as f:
        f.write(b'{"ts": 1.0, "event": "admission.ad')  # the kill landed mid-write
    assert write_death(log, "scheduler_died", [], exit_code=-9)
    lines = log.read_bytes().splitlines()
    assert lines[-2] == b'{"ts": 1.0, "event": "admission.ad'
    stop = orjson.loads(lines[-1])
    assert stop["event"] == "boot.stop" and stop["seq"] == 4  # after the last whole receipt


def test_no_log_or_no_receipt_writes_nothing_and_raises_nothing(tmp_path, capsys):
    assert not write_death(None, "scheduler_died", [])
    text = tmp_path / "text.log"
    text.write_text("Traceback (most recent call last):\n")
    assert not write_death(text, "scheduler_died", [])
    assert text.read_text() == "Traceback (most recent call last):\n"
    assert not write_death(tmp_path / "missing.jsonl", "scheduler_died", [])
    assert "boot.stop" in capsys.readouterr().err
