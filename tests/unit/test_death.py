"""The frontend's boot.stop after the scheduler process died: it continues the dead process's
boot, rank and seq, names the signal or exit code, ends each request that was in flight with an
abort, and survives a line the kill cut in half. And the boot.stop of a boot that failed before
serving: it ends the boot the failed process began (found by its pid), with the exit code and
the message, and nothing else."""

from __future__ import annotations

import orjson

from engine.observability.death import write_boot_failed, write_death
from engine.observability.receipts import Receipts


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
        ("request.abort", "r-0", "scheduler_died"),
        ("request.abort", "r-2", "scheduler_died"),
    ]
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


def begun(path, pid: int, n: int = 2) -> Receipts:
    """A boot that process ``pid`` began: boot.start and ``n`` receipts more, left open."""
    r = Receipts(path)
    r.emit("boot.start", config={}, pid=pid, ppid=1, host="h", argv=[], versions={})
    for _ in range(n):
        r.emit("notice", text="loading")
    r.close()
    return r


def test_a_failed_boot_ends_the_boot_its_process_began_with_the_exit_code_and_message(tmp_path):
    log = tmp_path / "boot.jsonl"
    older = begun(log, pid=41)  # an earlier boot in the same file, by another process
    Receipts(log, boot=older.boot, after=(older.seq, 0)).emit(
        "boot.stop", reason="sigterm", in_flight=0
    )
    failed = begun(log, pid=42)
    assert write_boot_failed(log, 42, 2, "tp 3 does not divide the model's 4 attention heads")
    *_, before, stop = records(log)
    assert stop["event"] == "boot.stop" and stop["reason"] == "boot_failed"
    assert (stop["boot"], stop["rank"], stop["seq"]) == (failed.boot, 0, before["seq"] + 1)
    assert stop["exit_code"] == 2 and stop["in_flight"] == 0
    assert stop["error"] == "tp 3 does not divide the model's 4 attention heads"


def test_a_failed_boot_with_no_boot_start_of_its_own_writes_nothing(tmp_path, capsys):
    log = tmp_path / "boot.jsonl"
    begun(log, pid=41)  # another process's boot, still open: not this one's to end
    before = log.read_bytes()
    assert not write_boot_failed(log, 42, 2, "killed before it wrote a receipt")
    assert not write_boot_failed(tmp_path / "missing.jsonl", 42, 2, "no log at all")
    assert not write_boot_failed(None, 42, 2, "no log asked for")
    assert log.read_bytes() == before
    assert capsys.readouterr().err == ""  # nothing began, nothing to say


def test_a_boot_that_ended_already_is_not_ended_twice(tmp_path):
    log = tmp_path / "boot.jsonl"
    r = begun(log, pid=42)
    Receipts(log, boot=r.boot, after=(r.seq, 0)).emit("boot.stop", reason="rank_lost", in_flight=0)
    before = log.read_bytes()
    assert not write_boot_failed(log, 42, 1, "the group failed")
    assert log.read_bytes() == before


def test_a_long_message_is_clipped_between_words(tmp_path):
    log = tmp_path / "boot.jsonl"
    begun(log, pid=42)
    assert write_boot_failed(log, 42, 2, "word " * 400)
    stop = records(log)[-1]
    assert len(stop["error"]) < 600 and stop["error"].endswith("more words)")
