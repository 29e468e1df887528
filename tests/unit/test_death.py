"""The frontend's boot.stop after the scheduler process died: it continues the dead process's
boot, rank and seq, and survives a line the kill cut in half."""

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
    assert write_death(log, "scheduler_died", in_flight=2)
    stop = records(log)[-1]
    assert stop["event"] == "boot.stop" and stop["reason"] == "scheduler_died"
    assert (stop["boot"], stop["rank"], stop["seq"], stop["iter"]) == (dead.boot, 0, 4, 7)
    assert stop["in_flight"] == 2


def test_a_line_cut_by_the_kill_stays_apart_from_the_stop(tmp_path):
    log = tmp_path / "boot.jsonl"
    boot_log(log)
    with log.open("ab") as f:
        f.write(b'{"ts": 1.0, "event": "admission.ad')  # the kill landed mid-write
    assert write_death(log, "scheduler_died", in_flight=1)
    lines = log.read_bytes().splitlines()
    assert lines[-2] == b'{"ts": 1.0, "event": "admission.ad'
    stop = orjson.loads(lines[-1])
    assert stop["event"] == "boot.stop" and stop["seq"] == 4  # after the last whole receipt


def test_no_log_or_no_receipt_writes_nothing_and_raises_nothing(tmp_path, capsys):
    assert not write_death(None, "scheduler_died", 0)
    text = tmp_path / "text.log"
    text.write_text("Traceback (most recent call last):\n")
    assert not write_death(text, "scheduler_died", 0)
    assert text.read_text() == "Traceback (most recent call last):\n"
    assert not write_death(tmp_path / "missing.jsonl", "scheduler_died", 0)
    assert "boot.stop" in capsys.readouterr().err
