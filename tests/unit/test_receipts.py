"""Receipts: never raise, count failures and leave a seq gap, say once-per-key things once,
write one JSON line per receipt with the common fields, and stay importable without torch."""

from __future__ import annotations

import errno
import io
import subprocess
import sys

import orjson
import pytest

from engine.observability import schema
from engine.observability.receipts import Receipts


def test_unknown_kind_does_not_raise_counts_a_failure_and_leaves_a_seq_gap(capsys):
    r = Receipts(capture=True)
    r.emit(schema.NOTICE, text="before")
    r.emit("no.such.kind", x=1)  # must not raise
    assert r.failures == 1
    r.emit(schema.NOTICE, text="after")
    seqs = [rec["seq"] for rec in r.records]
    assert [rec["text"] for rec in r.records] == ["before", "after"]
    assert seqs == [1, 3], "the failed receipt must consume its seq (a visible gap)"
    r.emit("no.such.kind")
    assert r.failures == 2
    err = capsys.readouterr().err
    assert err.count("receipt emitter failed") == 1  # reported once, then only counted
    assert "no.such.kind" in err


def test_once_emits_only_the_first_time_per_key():
    r = Receipts(capture=True)
    assert r.once("k", schema.NOTICE, text="first") is True
    assert r.once("k", schema.NOTICE, text="second") is False
    assert r.once("other", schema.NOTICE, text="third") is True
    assert [rec["text"] for rec in r.of(schema.NOTICE)] == ["first", "third"]
    assert r.notice("n", "said") is True
    assert r.notice("n", "said again") is False
    assert [rec["text"] for rec in r.of(schema.NOTICE)] == ["first", "third", "said"]


def test_violation_emits_once_per_kind_of_failure():
    r = Receipts(capture=True)
    assert r.violation("ledger", free=1, used=2) is True
    assert r.violation("ledger", free=9, used=9) is False
    assert r.violation("radix") is True
    got = r.of(schema.INVARIANT_VIOLATION)
    assert [(g["what"], g.get("free")) for g in got] == [("ledger", 1), ("radix", None)]
    assert r.failures == 0


def _common_ok(rec: dict, *, boot: str, rank: int, it: int) -> None:
    assert set(schema.COMMON_FIELDS) <= rec.keys(), set(schema.COMMON_FIELDS) - rec.keys()
    assert rec["v"] == schema.SCHEMA_VERSION
    assert (rec["boot"], rec["rank"], rec["iter"]) == (boot, rank, it)
    assert isinstance(rec["ts"], float) and rec["ts"] > 0
    assert schema.missing_fields(rec["event"], rec) == []


def test_file_sink_writes_one_json_line_per_receipt_with_the_common_fields(tmp_path):
    path = tmp_path / "logs" / "boot.jsonl"  # the folder is created
    r = Receipts(path, boot="b-test", rank=3)
    r.emit(schema.BOOT_READY, startup_s=1.5)
    r.iter = 7
    r.emit(
        schema.EVICTION,
        reason="r",
        asked=4,
        evicted=4,
        staged=0,
        evictable_before=8,
        evictable_after=4,
    )
    r.emit("no.such.kind")  # lost: no line, but a seq gap
    r.emit(schema.NOTICE, text="x" * 3, nested={"a": [1, 2]})
    r.close()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 3
    recs = [orjson.loads(line) for line in lines]
    assert [x["event"] for x in recs] == [schema.BOOT_READY, schema.EVICTION, schema.NOTICE]
    assert [x["seq"] for x in recs] == [1, 2, 4]
    assert [x["iter"] for x in recs] == [0, 7, 7]
    for rec in recs:
        _common_ok(rec, boot="b-test", rank=3, it=rec["iter"])
    assert recs[0]["startup_s"] == 1.5
    assert recs[1]["evicted"] == 4
    assert recs[2]["nested"] == {"a": [1, 2]}
    assert r.failures == 1


def test_file_sink_appends_across_emitters(tmp_path):
    path = tmp_path / "boot.jsonl"
    for boot in ("b-one", "b-two"):
        r = Receipts(path, boot=boot)
        r.emit(schema.NOTICE, text=boot)
        r.close()
    recs = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [(x["boot"], x["seq"]) for x in recs] == [("b-one", 1), ("b-two", 1)]


def test_stream_and_capture_sinks_agree():
    buf = io.BytesIO()
    r = Receipts(stream=buf, capture=True, boot="b-s")
    r.emit(schema.ALLOC_FLUSH, need=16, staged=16, freed=16)
    (line,) = buf.getvalue().splitlines()
    on_stream = orjson.loads(line)
    _common_ok(on_stream, boot="b-s", rank=0, it=0)
    assert on_stream == r.records[0]


@pytest.mark.parametrize("module", ["engine.observability.schema", "engine.observability.receipts"])
def test_obs_modules_do_not_import_torch(module):
    code = f"import {module}, sys; assert 'torch' not in sys.modules, 'torch was imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


class FullDisk(io.RawIOBase):
    """A raw file on a disk with ``room`` bytes left: a write takes what fits and then fails
    with ENOSPC, as write(2) does; ``free`` makes room again."""

    def __init__(self, room: int) -> None:
        self.data, self.room = bytearray(), room

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        if self.room == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(b), self.room)
        self.data += bytes(b[:n])
        self.room -= n
        return n

    def free(self, room: int) -> None:
        self.room = room


def test_a_receipt_that_could_not_be_written_is_counted_apart_and_never_written_later(capsys):
    disk = FullDisk(room=0)
    r = Receipts(stream=disk, boot="b-full")
    r.emit(schema.NOTICE, text="lost")
    r.emit(schema.REQUEST_FINISH, rid="a", reason="stop", output_tokens=1)
    assert r.failed == {schema.NOTICE: 1, schema.REQUEST_FINISH: 1} and r.written == {}
    assert r.counts == {schema.NOTICE: 1, schema.REQUEST_FINISH: 1}  # the decisions: all made
    disk.free(40)  # room for part of a line: the rest fails, a cut line
    r.emit(schema.NOTICE, text="cut")
    disk.free(10_000)
    r.emit(schema.NOTICE, text="kept")
    r.emit(schema.NOTICE, text="next")
    r.close()
    assert r.failed == {schema.NOTICE: 2, schema.REQUEST_FINISH: 1}
    assert r.written == {schema.NOTICE: 2}
    lines = bytes(disk.data).split(b"\n")
    assert len(lines[0]) == 40 and lines[-1] == b""  # the cut line, then the kept ones whole
    kept = [orjson.loads(line) for line in lines[1:-1]]
    assert [(k["text"], k["seq"]) for k in kept] == [("kept", 4), ("next", 5)]  # seq gaps
    assert b"lost" not in disk.data  # a failed receipt never reaches the log afterwards
    assert capsys.readouterr().err.count("No space left on device") == 1


def test_a_boot_log_on_a_full_disk_counts_its_failures_and_holds_nothing_back(capsys):
    r = Receipts("/dev/full", boot="b-dev-full")  # every write(2) there fails with ENOSPC
    r.emit(schema.NOTICE, text="x")
    r.close()  # a buffered file would hold the failed line and try it again here
    assert r.failed == {schema.NOTICE: 1} and r.written == {} and r.failures == 1
    err = capsys.readouterr().err
    assert err.count("No space left on device") == 1 and "closing" not in err, err


def test_a_boot_log_that_fails_to_close_says_so_and_does_not_raise(tmp_path, capsys):
    class Unclosable(io.RawIOBase):
        def close(self) -> None:
            raise OSError(errno.EIO, "Input/output error")

    r = Receipts(tmp_path / "boot.jsonl")
    r.emit(schema.NOTICE, text="x")
    r._file.close()
    r._file = Unclosable()  # a file system that fails the close (NFS reports its errors here)
    r.close()  # must not raise into a shutdown
    assert "closing the boot log failed" in capsys.readouterr().err
