"""The reader's fast pass changes nothing. Against the line-by-line loop it replaced (kept here as
the reference, on the reader's own line classifier), every count, example, seq track, receipt and
text line is the same for any mix of lines, any block size (blocks then split lines anywhere),
plain or gzip, whole or cut; and every verdict of the shipped specs is the same as with that loop,
``Bus.receipt`` dispatch and the wedge detector's full feed on every receipt. Each test reads
both ways: with the compiled loop (``audit.native``) and with the reader's Python loop alone."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from audit import native, reader, readstats
from audit.reader import UnreadableLog, scan
from audit.readstats import BITMAP_LIMIT, ReadStats, SeqTrack
from audit.streams import open_log
from engine.observability import schema


@pytest.fixture(autouse=True, params=["compiled", "python"])
def loop(request, monkeypatch):
    """Each test twice: the reader with its compiled loop, and with its Python loop alone."""
    if request.param == "python":
        monkeypatch.setattr(native, "fast_run", lambda: None)
    elif native.why_not() is not None:
        pytest.skip(f"the compiled loop: {native.why_not()}")
    return request.param


def reference_scan(paths, on_receipt=None, on_text=None):
    """The reader's loop before the fast pass: one line at a time, each through ``_classify``."""
    stats = ReadStats()
    for p in paths:
        path = Path(p)
        if path.is_dir():
            raise UnreadableLog(f"{path}: is a directory")
        stats.files += 1
        lineno = 0
        with open_log(path) as fh:
            it = iter(fh)
            try:
                nxt = next(it, None)
            except (OSError, EOFError) as e:
                raise UnreadableLog(f"{path}: {e}") from e
            while nxt is not None:
                raw = nxt
                try:
                    nxt = next(it, None)
                except (OSError, EOFError):
                    nxt = None
                    stats.truncated += 1
                lineno += 1
                stats.lines += 1
                stats.bytes += len(raw)
                what, obj = reader._classify(raw, stats, nxt is None)
                if what == "receipt":
                    track = stats.seqs.setdefault((obj["boot"], obj["rank"]), SeqTrack())
                    track.add(obj["seq"])
                    kind = schema.CATALOG.get(obj["event"])
                    if kind is None:
                        stats.unknown_kind += 1
                        continue
                    deep = depth(obj) > readstats.MAX_DEPTH
                    if any(f not in obj for f in kind.fields) or deep:
                        stats.malformed += 1
                        stats.deep += deep
                        stats.examples.setdefault("malformed", raw[:200].decode("utf-8", "replace"))
                        continue
                    stats.receipts += 1
                    stats.kinds[(obj["rank"], obj["event"])] += 1
                    track.kinds[obj["event"]] += 1
                    if type(obj.get("iter")) is int:  # what ranks_agree kept, per (boot, rank)
                        track.top_iter = max(track.top_iter, obj["iter"])
                    if on_receipt is not None:
                        on_receipt(obj)
                elif what != "skip" and on_text is not None:
                    on_text(what, obj, f"{path.name}:{lineno}")
    stats.settle()
    return stats


def depth(v) -> int:
    """Containers nested in ``v``, itself included (level by level)."""
    n, level = 0, [v]
    while level:
        n += 1
        level = [
            x
            for c in level
            for x in (c.values() if isinstance(c, dict) else c)
            if isinstance(x, dict | list)
        ]
    return n


def tracks(stats: ReadStats) -> dict:
    return {
        k: (
            t.distinct,
            t.duplicates,
            t.invalid,
            t.top,
            t.top_iter,
            t.first_missing(),
            bytes(t.bits),
            sorted(t.overflow),
        )
        for k, t in stats.seqs.items()
    }


def read_both(paths, **kw):
    got, want = ([], []), ([], [])
    new = scan(paths, got[0].append, lambda *a: got[1].append(a), **kw)
    old = reference_scan(paths, want[0].append, lambda *a: want[1].append(a))
    assert new.as_dict() == old.as_dict()
    assert (new.kinds, new.examples, new.incomplete()) == (
        old.kinds,
        old.examples,
        old.incomplete(),
    )
    assert tracks(new) == tracks(old)
    assert got == want
    return new


KINDS = ["request.received", "admission.admit", "admission.park", "boot.stop", "no.such.kind"]
receipt = st.fixed_dictionaries(
    {
        "event": st.sampled_from(KINDS),
        "boot": st.one_of(st.sampled_from(["b-1", "b-2"]), st.just(3)),
        "rank": st.one_of(st.integers(0, 2), st.just(True), st.just(1.0)),
    },
    optional={
        "v": st.just(1),
        "seq": st.one_of(
            st.integers(-1, 30), st.just(BITMAP_LIMIT + 1), st.just(2**64), st.just(1.5), st.none()
        ),
        "iter": st.one_of(st.integers(0, 5), st.just("7")),
        "rid": st.sampled_from(["r-1", "r-2"]),
        "tokens": st.integers(0, 3),
        "reason": st.just("x"),
        "need": st.integers(0, 5),
        "fundable": st.just(0),
        "prompt_tokens": st.just(3),
        "max_new_tokens": st.just(2),
        "in_flight": st.just(0),
    },
)
line = st.one_of(
    st.builds(json.dumps, receipt),
    st.builds(lambda r: "[rank1]: " + json.dumps(r), receipt),
    st.sampled_from(
        [
            "",
            "  ",
            "\r",
            "plain text",
            "Traceback (most recent call last):",
            '{"level": "info"}',
            '{"event": "request.received", ',
            "[x] y",
            "{",
        ]
    ),
    # receipts 256 and 257 containers deep (themselves included), and one with a flat list of
    # 300 lists: only the one past the limit (256) is malformed
    st.builds(
        lambda r, n, flat: json.dumps(
            r | {"rid": [[]] * 300 if flat else json.loads("[" * n + "]" * n)}
        ),
        receipt,
        st.sampled_from([255, 256]),
        st.booleans(),
    ),
    st.text(max_size=30),
)


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.lists(line, max_size=25), min_size=1, max_size=2),
    st.sampled_from(["\n", "\r\n"]),
    st.booleans(),
    st.booleans(),
    st.sampled_from([1, 2, 5, 16, 1 << 20]),
)
def test_any_lines_read_as_the_line_by_line_loop_read_them(
    tmp_path, monkeypatch, files, eol, final_newline, gz, block
):
    monkeypatch.setattr(reader, "_BLOCK", block)
    for module in (reader, readstats):  # a small bitmap, so runs of seqs cross its end
        monkeypatch.setattr(module, "BITMAP_LIMIT", 20)
    paths = []
    for i, lines in enumerate(files):
        body = eol.join(s.replace("\n", " ").replace("\r", " ") for s in lines)
        raw = (body + (eol if final_newline and lines else "")).encode("utf-8", "surrogatepass")
        p = tmp_path / f"{i}.log"
        p.write_bytes(gzip.compress(raw) if gz else raw)
        paths.append(p)
    read_both(paths)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10**6), st.sampled_from([7, 100, 1 << 20]))
def test_a_gzip_cut_anywhere_reads_as_before(tmp_path, monkeypatch, cut_at, block):
    monkeypatch.setattr(reader, "_BLOCK", block)
    lines = [
        json.dumps(
            {
                "event": "request.received",
                "v": 1,
                "boot": "b",
                "rank": 0,
                "seq": i,
                "rid": f"r-{i}",
                "prompt_tokens": 1,
                "max_new_tokens": 1,
                "pad": "x" * (i % 50),
            }
        )
        for i in range(1, 400)
    ]
    data = gzip.compress(("\n".join(lines) + "\n").encode())
    p = tmp_path / "cut.gz"
    p.write_bytes(data[: 11 + cut_at % (len(data) - 11)])
    try:
        reference_scan([p])
    except UnreadableLog:  # cut before the first line ends: unreadable, as before
        with pytest.raises(UnreadableLog):
            scan([p])
        return
    read_both([p])


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.integers(0, 300), max_size=30),
    st.integers(1, 2000),
    st.integers(0, 200),
)
def test_a_run_of_seqs_written_at_once_is_each_seq_added(before, lo, n):
    one, run = SeqTrack(), SeqTrack()
    for s in before:
        one.add(s)
        run.add(s)
    for s in range(lo, lo + n + 1):
        one.add(s)
    run.add_run(lo, lo + n)
    assert (run.bits, run.distinct, run.duplicates, run.top) == (
        one.bits,
        one.distinct,
        one.duplicates,
        one.top,
    )


def test_a_run_of_seqs_across_the_bitmap_end_goes_on_in_the_overflow_set(tmp_path, monkeypatch):
    for module in (reader, readstats):
        monkeypatch.setattr(module, "BITMAP_LIMIT", 20)
    seqs = [*range(1, 26), 19, 21, 0]
    p = tmp_path / "a.log"
    p.write_text(
        "".join(
            json.dumps({"event": "x", "v": 1, "boot": "b", "rank": 0, "seq": s}) + "\n"
            for s in seqs
        )
    )
    stats = read_both([p])
    track = stats.seqs[("b", 0)]
    assert sorted(track.overflow) == [20, 21, 22, 23, 24, 25]
    assert (track.distinct, track.duplicates, track.invalid) == (25, 2, 1)


VERDICT_KINDS = [
    "boot.start",
    "boot.ready",
    "request.received",
    "admission.admit",
    "admission.defer",
    "admission.park",
    "admission.unpark",
    "request.finish",
    "request.abort",
    "retract",
    "requeue",
    "eviction",
    "iteration",
    "boot.stop",
    "alloc.oom",
    "relief.engage",
]
step = st.tuples(
    st.integers(0, 1),  # rank
    st.sampled_from(VERDICT_KINDS),
    st.sampled_from([0.01, 5.0, 40.0]),  # seconds since the last receipt
    st.booleans(),  # a new iteration
    st.integers(0, 3),  # which rid, and a small number for every other field
    st.sampled_from(["keep"] * 12 + ["lose", "twice", "text"]),
)


def verdict_log(steps) -> str:
    out, seq, ts, it = [], {}, 1000.0, 0
    for rank, kind, dt, new_iter, n, fate in steps:
        ts, it = ts + dt, it + new_iter
        seq[rank] = seq.get(rank, 0) + 1
        f = dict.fromkeys(schema.CATALOG[kind].fields, n) | {"config": {}, "reason": "x"}
        if kind == "iteration":
            f |= {"running": n % 2, "waiting": n, "parked": n // 2}
            if n > 1:
                f |= dict(zip(schema.PROGRESS, (n, n, n)))
        rec = {
            "ts": ts,
            "event": kind,
            "v": 1,
            "boot": "b-1",
            "rank": rank,
            "iter": it,
            "seq": seq[rank],
            **f,
            "rid": f"r-{n}",
            "rids": [f"r-{n}"],
        }
        text = json.dumps(rec)
        out += {"keep": [text], "lose": [], "twice": [text, text], "text": [text, "Killed"]}[fate]
    return "\n".join(out) + "\n"


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, max_size=60))
# two wedges: the one named first is on the rank whose first receipt came first
@example(
    [
        (1, "boot.start", 0.01, False, 0, "keep"),
        (0, "admission.defer", 0.01, False, 0, "keep"),
        (1, "admission.defer", 0.01, False, 0, "keep"),
        (0, "boot.start", 40.0, False, 0, "keep"),
    ]
)
# a wedge by the progress rule: counters unchanged, then a receipt of the same iter 40 s later
@example(
    [
        (0, "boot.ready", 0.01, False, 0, "keep"),
        (0, "iteration", 0.01, False, 3, "keep"),
        (0, "eviction", 40.0, False, 0, "keep"),
    ]
)
def test_every_shipped_verdict_is_what_the_line_by_line_loop_and_full_dispatch_gave(
    tmp_path, steps
):
    from audit import verdict, wedge
    from audit.spec import load_spec, shipped

    p = tmp_path / "a.log"
    p.write_text(verdict_log(steps))
    specs = [load_spec(s) for s in shipped()]
    new = verdict.evaluate(specs, [p]).as_dict()
    with pytest.MonkeyPatch.context() as mp:  # before: each receipt through Bus.receipt, and
        mp.setattr(verdict, "receivers", lambda bus: bus)  # the wedge detector fed in full
        mp.setattr(
            verdict,
            "scan",
            lambda logs, on_text, routes, **_: reference_scan(logs, routes.receipt, on_text),
        )
        mp.setattr(wedge, "_STARTS", frozenset(schema.CATALOG))
        assert new == verdict.evaluate(specs, [p]).as_dict()


@pytest.mark.parametrize(
    ("rid1", "verdict"), [(["a", {"b": 1}], "PASS"), (["a", {"b": 2}], "FAIL")]
)
def test_ranks_agree_hashes_a_list_or_an_object_in_a_field_by_value(tmp_path, rid1, verdict):
    from audit.spec import load_spec, shipped
    from audit.verdict import evaluate

    lines = []
    for rank, rid in ((0, ["a", {"b": 1}]), (1, rid1)):
        for seq, (kind, f) in enumerate(
            [("boot.start", {"config": {}}), ("admission.admit", {"rid": rid, "tokens": 1})], 1
        ):
            lines.append(
                json.dumps(
                    {
                        "ts": 1.0,
                        "event": kind,
                        "v": 1,
                        "boot": "b",
                        "rank": rank,
                        "iter": 1,
                        "seq": seq,
                        **f,
                    }
                )
            )
    p = tmp_path / "a.log"
    p.write_text("\n".join(lines) + "\n")
    spec = next(s for s in shipped() if s.name == "admission_park")
    claims = evaluate([load_spec(spec)], [p]).specs[0].claims
    assert next(c for c in claims if c.kind == "ranks_agree").status.value == verdict
