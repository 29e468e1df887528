"""The reader: one pass over mixed logs; every line is accounted for; seq gaps and duplicates
are found whatever the line order; nothing crashes it (property test)."""

from __future__ import annotations

import gzip
import json
import os
import random
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from audit.reader import UnreadableLog, scan
from audit.streams import spooled
from tests.unit.audit_logs import LogText


def collect(paths):
    receipts, texts = [], []
    stats = scan(paths, receipts.append, lambda src, line, where: texts.append((src, line)))
    return stats, receipts, texts


def test_mixed_lines_are_each_counted_once(tmp_path):
    log = LogText().ready().received("r-1")
    log.text("plain text from stderr").text('{"level": "info", "msg": "a foreign engine"}')
    log.text("{not json at all").text("").text(
        "[rank1]: " + log.lines[0].replace('"rank":0', '"rank":1')
    )
    log.r("no.such.kind", x=1).r("request.finish", rid="r-1")  # finish without reason/tokens
    stats, receipts, texts = collect([log.write(tmp_path / "a.log")])
    assert stats.lines == 10 and stats.blank == 1
    assert stats.receipts == 4  # boot.start, boot.ready, received, and rank 1's boot.start
    assert [r["rank"] for r in receipts] == [0, 0, 0, 1]
    assert texts == [
        ("text", "plain text from stderr"),
        ("json", '{"level": "info", "msg": "a foreign engine"}'),
    ]
    assert (stats.garbage, stats.unknown_kind, stats.malformed) == (1, 1, 1)
    assert stats.incomplete()[0] == "unparsed_lines"


def test_a_logger_head_before_a_dict_repr_is_text_not_garbage(tmp_path):
    # another engine's logger writes "[time TP0] " before a Python dict's repr: not a receipt
    # behind a rank prefix, and not a line the reader failed to parse
    log = LogText().ready()
    log.text("[2025-01-01 12:00:11 TP0] {'model': 'x'}")
    stats, receipts, texts = collect([log.write(tmp_path / "a.log")])
    assert texts == [("text", "[2025-01-01 12:00:11 TP0] {'model': 'x'}")]
    assert stats.garbage == 0 and stats.incomplete() is None


def test_a_truncated_last_line_is_counted_as_truncated_not_garbage(tmp_path):
    log = LogText().ready().received("r-1")
    p = tmp_path / "a.log"
    p.write_text(str(log) + log.lines[-1][:30], encoding="utf-8")  # no newline at the end
    stats, receipts, _ = collect([p])
    assert (stats.truncated, stats.garbage, len(receipts)) == (1, 0, 3)


def test_gzip_is_read_and_a_cut_gzip_keeps_what_came(tmp_path):
    log = LogText().ready()
    for i in range(200):
        log.received(f"r-{i}")
    data = gzip.compress(str(log).encode())
    (tmp_path / "a.log.gz").write_bytes(data)
    stats, receipts, _ = collect([tmp_path / "a.log.gz"])
    assert len(receipts) == 202 and stats.incomplete() is None
    (tmp_path / "cut.gz").write_bytes(data[: len(data) // 2])
    stats, receipts, _ = collect([tmp_path / "cut.gz"])
    assert 0 < len(receipts) < 202 and stats.truncated >= 1
    assert stats.incomplete() is not None


def test_unreadable_inputs_raise_unreadable_log(tmp_path):
    with pytest.raises(UnreadableLog, match="No such file"):
        scan([tmp_path / "missing.log"])
    with pytest.raises(UnreadableLog, match="directory"):
        scan([tmp_path])
    (tmp_path / "bad.gz").write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    with pytest.raises(UnreadableLog):
        scan([tmp_path / "bad.gz"])
    # a valid gzip header, then a stored block whose lengths disagree: zlib's own error, which
    # is not an OSError, is still a log that cannot be read, never a crash
    (tmp_path / "stored.gz").write_bytes(
        b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"\x01\x01\x00\x00\x00"
    )
    with pytest.raises(UnreadableLog, match="invalid stored block lengths"):
        scan([tmp_path / "stored.gz"])


def test_a_seq_gap_and_a_duplicate_are_found_in_any_line_order(tmp_path):
    log = LogText().ready().received("r-1").received("r-2", lose=True).received("r-3")
    lines = list(log.lines)
    random.Random(1).shuffle(lines)
    (tmp_path / "a.log").write_text("\n".join(lines) + "\n")
    stats, _, _ = collect([tmp_path / "a.log"])
    assert stats.gaps() == {("b-00000001", 0): 1}
    assert stats.seqs[("b-00000001", 0)].first_missing() == 4
    assert stats.incomplete()[0] == "seq_gap"
    whole = LogText().ready().received("r-1").write(tmp_path / "b.log")
    stats, _, _ = collect([whole, whole])  # the same log given twice
    assert stats.gaps() == {} and stats.incomplete()[0] == "seq_duplicate"


def test_interleaved_ranks_each_keep_their_own_seq(tmp_path):
    log = LogText()
    for i in range(5):
        log.received(f"r-{i}", rank=i % 2)
    stats, _, _ = collect([log.write(tmp_path / "a.log")])
    assert stats.ranks == {0, 1} and stats.incomplete() is None


line_text = st.one_of(
    st.text(max_size=200),
    st.builds(
        json.dumps,
        st.dictionaries(
            st.sampled_from(
                ["event", "v", "boot", "rank", "seq", "rid", "iter", "ts", "rids", "x"]
            ),
            st.one_of(
                st.none(),
                st.integers(-5, 2**70),
                st.text(max_size=8),
                st.floats(),
                st.lists(st.integers(), max_size=3),
                st.sampled_from(["request.received", "retract", "boot.stop"]),
            ),
        ),
    ),
)


@given(st.lists(line_text, max_size=40), st.booleans(), st.booleans())
def test_arbitrary_lines_never_crash_the_reader_or_the_shipped_specs(
    tmp_path_factory, lines, gz, nl
):
    from audit.spec import load_spec, shipped
    from audit.verdict import evaluate

    body = "\n".join(s.replace("\n", " ") for s in lines) + ("\n" if nl else "")
    raw = body.encode("utf-8", "surrogatepass")
    p = tmp_path_factory.mktemp("h") / "a.log"
    p.write_bytes(gzip.compress(raw) if gz else raw)
    report = evaluate([load_spec(s) for s in shipped()], [p])
    st_ = report.stats
    assert st_.lines == sum(
        [
            st_.receipts,
            st_.text,
            st_.foreign_json,
            st_.blank,
            st_.garbage,
            st_.truncated,
            st_.unknown_kind,
            st_.malformed,
            st_.seq_invalid,
        ]
    )
    assert sum(st_.kinds.values()) == st_.receipts  # every evaluated receipt counted by kind


def test_a_log_is_read_no_further_than_asked_and_says_how_far_it_read(tmp_path):
    a = LogText().ready().received("r-1").finish("r-1").write(tmp_path / "a.log")
    b = LogText().ready().write(tmp_path / "b.log")
    whole = [a.stat().st_size, b.stat().st_size]
    sizes: list[int] = []
    stats = scan([a, b], sizes=sizes)
    assert sizes == whole and stats.receipts == 6
    first = len(a.read_bytes().split(b"\n")[0]) + 1
    sizes = []
    stats = scan([a, b], upto=[first + 5, whole[1]], sizes=sizes)  # a's second line cut
    assert sizes == [first + 5, whole[1]]
    assert (stats.receipts, stats.truncated) == (3, 1)


def _fifo(tmp_path, data: bytes):
    """A FIFO with a writer that writes ``data`` into it and closes it."""
    path = tmp_path / "pipe"
    os.mkfifo(path)

    def write() -> None:
        with open(path, "wb") as fh:
            fh.write(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return path, writer


def test_a_fifo_is_read_once_as_the_file_is_and_refused_the_second_time(tmp_path):
    log = LogText().ready()
    for i in range(50):
        log.received(f"r-{i}")
    data = str(log).encode()
    (tmp_path / "a.log").write_bytes(data)
    expected, want, _ = collect([tmp_path / "a.log"])
    path, writer = _fifo(tmp_path, gzip.compress(data))  # gzip through a pipe, too
    stats, receipts, _ = collect([path])
    writer.join(60)
    assert receipts == want and stats.as_dict() == expected.as_dict()
    # read again, the stream would be empty: refused at once, without waiting for a writer
    # (one is there all the same, so that a reading that does not refuse ends, and fails)
    idle = threading.Thread(target=lambda: open(path, "wb").close(), daemon=True)
    idle.start()
    with pytest.raises(UnreadableLog, match="reads once"):
        scan([path])
    # the idle writer's open returns once a reader comes; refused at once, the test may get
    # here before that open began, and a reader come and gone then would leave it waiting
    deadline = time.monotonic() + 60
    while idle.is_alive() and time.monotonic() < deadline:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        idle.join(0.05)
    assert not idle.is_alive(), "the idle writer's open never returned"


def test_a_stream_spooled_is_copied_once_under_its_name_and_the_copy_removed(tmp_path):
    """For a command that reads its logs twice: a FIFO's bytes as they came (gzip stays gzip),
    in a file named as the FIFO, read twice alike; a file passes as it is."""
    log = LogText().ready()
    log.received("r-1")
    (tmp_path / "a.log").write_bytes(str(log).encode())
    packed = gzip.compress(str(log).encode())
    path, writer = _fifo(tmp_path, packed)
    with spooled([str(tmp_path / "a.log"), str(path)]) as (a, copy):
        assert Path(copy).is_file() and Path(copy).name == path.name  # not the FIFO itself
        writer.join(60)
        assert a == str(tmp_path / "a.log")
        assert Path(copy).read_bytes() == packed
        assert collect([copy])[1] == collect([copy])[1] == collect([a])[1]
    assert not Path(copy).exists()


def test_a_receipt_nested_too_deep_is_counted_deep_even_when_it_lacks_fields_too(tmp_path):
    """Both at once: the sentence names the depth (it is why the receipt was not read), as for
    a receipt with all its fields."""
    deep = json.loads("[" * 257 + "]" * 257)
    lines = [
        {"event": "request.received", "v": 1, "boot": "b", "rank": 0, "seq": 1, "rid": deep},
        {
            "event": "request.received",
            "v": 1,
            "boot": "b",
            "rank": 0,
            "seq": 2,
            "rid": "r-1",
            "prompt_tokens": 1,
            "max_new_tokens": 1,
            "note": deep,
        },
    ]
    (tmp_path / "a.log").write_text("".join(json.dumps(x) + "\n" for x in lines))
    stats, receipts, _ = collect([tmp_path / "a.log"])
    assert receipts == [] and (stats.malformed, stats.deep) == (2, 2)
    assert "nest a value deeper than 256 levels" in stats.incomplete()[1]


def shipped(line: str, **beside: object) -> str:
    """A line as docker's json-file driver, Fluent Bit or Fluentd keeps it."""
    return json.dumps({"log": line + "\n", "stream": "stdout", **beside})


def test_a_log_shippers_record_is_read_as_the_line_it_holds(tmp_path):
    log = LogText().ready()
    receipt = log.lines.pop()  # boot.ready, shipped instead of written
    log.text(shipped(receipt, time="2025-01-22T18:27:15.731100201Z"))
    log.text(shipped("INFO 01-22 18:27:15 metrics.py:449] Avg prompt throughput: 1.0 tokens/s"))
    log.text(shipped(""))  # an empty line the process wrote
    log.text('{"log": {"level": "info"}, "msg": "x"}')  # 'log' not a line: foreign JSON
    log.r("request.received", rid="r-1", prompt_tokens=5, max_new_tokens=3)
    stats, receipts, texts = collect([log.write(tmp_path / "a.log")])
    assert [r["event"] for r in receipts] == ["boot.start", "boot.ready", "request.received"]
    assert stats.incomplete() is None  # the shipped receipt kept its place in the seq run
    assert texts == [
        ("text", "INFO 01-22 18:27:15 metrics.py:449] Avg prompt throughput: 1.0 tokens/s"),
        ("json", '{"log": {"level": "info"}, "msg": "x"}'),
    ]
    assert (stats.text, stats.foreign_json, stats.blank) == (1, 1, 1)
