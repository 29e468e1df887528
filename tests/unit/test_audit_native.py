"""The reader's compiled loop (``audit.native``) against the reader's Python loop alone and the
line-by-line reference: runs of receipts in sequence, the loop's own ground, with one line of a
run now and then not what the loop may take (no "v", a required field missing, nested past the
limit, another rank, a seq that jumps or crosses the bitmap's end, an iter past 64 bits, a kind
the catalog lacks, text); what each loop takes; a receiver's exception; building it; every self-test case's verdict with
the compiled receivers and without."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit import native, reader, readstats
from audit.reader import scan
from audit.render import to_json
from audit.selftest import case_files, case_paths
from audit.spec import load_spec, shipped
from audit.verdict import evaluate
from engine.observability import schema
from tests.unit.test_audit_reader_pass import loop, read_both, verdict_log  # noqa: F401 (a fixture)
from tests.unit.test_audit_reader_pass import step as verdict_step

KINDS = ["request.received", "admission.admit", "admission.defer", "request.finish", "eviction"]
HOW = ["keep"] * 10 + [
    "no_v",
    "no_field",
    "deep",
    "other_rank",
    "other_boot",
    "jump",
    "back",
    "big_iter",
    "unknown",
    "text",
    "bool_rank",
    "float_seq",
    "list",
    "str_boot_int",
    "nested_event",
]


def run_log(steps, limit_seq: int = 0) -> str:
    out, seq = [], limit_seq
    for kind, how, n in steps:
        seq += 1
        rec = {"ts": 1.0 + seq, "v": 1, "boot": "b", "rank": 0, "iter": n + seq // 7, "seq": seq}
        rec |= dict.fromkeys(schema.CATALOG[kind].fields, n) | {"rid": f"r-{n}", "event": kind}
        if how == "no_v":
            del rec["v"]
        elif how == "no_field":
            del rec[schema.CATALOG[kind].fields[0]]
        elif how == "deep":
            rec["pad"] = json.loads("[" * 257 + "]" * 257)
        elif how == "other_rank":
            rec["rank"] = 1
        elif how == "other_boot":
            rec["boot"] = "b2"
        elif how == "jump":
            seq += 3
            rec["seq"] = seq
        elif how == "back":
            rec["seq"] = max(1, seq - 5)
        elif how == "big_iter":
            rec["iter"] = 2**70
        elif how == "unknown":
            rec["event"] = "no.such.kind"
        elif how == "bool_rank":
            rec["rank"] = False
        elif how == "float_seq":
            rec["seq"] = float(seq)
        elif how == "str_boot_int":
            rec["boot"] = 7
        elif how == "nested_event":
            rec = {"outer": rec}
        line = json.dumps(rec)
        if how == "text":
            line = "INFO a text line between receipts"
        elif how == "list":
            line = json.dumps([rec])
        out.append(line)
    return "\n".join(out) + "\n"


step = st.tuples(st.sampled_from(KINDS), st.sampled_from(HOW), st.integers(0, 4))


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(step, max_size=80),
    st.sampled_from([1 << 20, 300, 41]),
    st.sampled_from([0, 25, 2**62]),
)
def test_runs_of_receipts_read_as_the_line_by_line_loop_read_them(
    tmp_path, monkeypatch, steps, block, start
):
    monkeypatch.setattr(reader, "_BLOCK", block)
    for module in (reader, readstats):  # a small bitmap: runs cross its end
        monkeypatch.setattr(module, "BITMAP_LIMIT", 40)
    p = tmp_path / "run.log"
    p.write_text(run_log(steps, start))
    read_both([p])


def taken(monkeypatch) -> list[int]:
    """What the compiled loop takes, call by call (lines it handled)."""
    got: list[int] = []
    run = native.fast_run()

    def counted(lines, i, *rest):
        out = run(lines, i, *rest)
        got.append(out[0] - i)
        return out

    monkeypatch.setattr(native, "fast_run", lambda: counted)
    return got


def test_the_compiled_loop_takes_a_clean_run_and_stops_at_what_it_may_not_take(
    tmp_path, monkeypatch, request
):
    if request.getfixturevalue("loop") != "compiled":
        pytest.skip("what the compiled loop takes")
    steps = [("admission.admit", "keep", 1)] * 50 + [("admission.admit", "no_v", 1)]
    steps += [("request.received", "keep", 2)] * 49
    p = tmp_path / "a.log"
    p.write_text(run_log(steps))
    got = taken(monkeypatch)
    stats = read_both([p])
    # the first line goes the Python way (no run yet); the loop stops before the line without
    # "v" (not a receipt: foreign JSON), and takes nothing at the next (its seq follows no run):
    # every other line it takes, over however many blocks the file was read in
    assert sum(got) == 97 and got.count(0) == 1 and stats.receipts == 99


def test_a_text_log_goes_the_python_way_after_a_few_lines(tmp_path, monkeypatch, request):
    if request.getfixturevalue("loop") != "compiled":
        pytest.skip("what the compiled loop takes")
    p = tmp_path / "a.log"
    p.write_text(run_log([("admission.admit", "keep", 1)] * 3) + "plain text\n" * 100)
    got = taken(monkeypatch)
    read_both([p])
    # two receipts taken, then a call per text line until the rest of the block goes at once
    assert got[0] == 2 and got[1:] == [0] * (reader._STUCK + 1)


def test_a_receivers_exception_is_raised_from_the_loop(tmp_path):
    p = tmp_path / "a.log"
    p.write_text(run_log([("admission.admit", "keep", 1)] * 10))
    seen: list[int] = []

    def boom(rec):
        seen.append(rec["seq"])
        if rec["seq"] == 5:
            raise ValueError("a claim broke at seq 5")

    with pytest.raises(ValueError, match="seq 5"):
        scan([p], routes={"admission.admit": (boom,)})
    assert seen == [1, 2, 3, 4, 5]


def test_build_and_status_say_where_it_is(monkeypatch):
    out = subprocess.run(
        [sys.executable, "-m", "audit.native", "status"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "the auditor's native reader" in out.stdout
    monkeypatch.setenv("ATTEST_AUDIT_NATIVE", "0")
    native.why_not.cache_clear()
    try:
        assert native.why_not() == "turned off (ATTEST_AUDIT_NATIVE=0)"
        monkeypatch.delenv("ATTEST_AUDIT_NATIVE")
        # an installed package ships no C source: it reads in Python, and building says why not
        monkeypatch.setattr(native, "SOURCE", native.SOURCE.with_name("absent.c"))
        native.why_not.cache_clear()
        assert native.why_not() == "its source absent.c is not here"
        with pytest.raises(FileNotFoundError):
            native.build()
        assert native.main(["build"]) == 0
    finally:
        native.why_not.cache_clear()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(verdict_step, max_size=60),
    st.lists(st.booleans(), min_size=12, max_size=12),
    st.booleans(),
)
def test_a_share_that_passes_over_lines_decides_as_the_whole_reading(
    tmp_path, steps, where, per_rank
):
    """Shares as ``audit.apart`` runs them, in this process: the first reads every line and
    hands its reading numbers on; another passes over the lines of kinds its windows do not
    read (where its windows read no text and not every receipt). Each window's verdict is the
    one a single reading gives, from one log or from a log per rank (the second gzipped)."""
    import gzip

    from audit import verdict
    from audit.spec import load_spec, shipped

    text = verdict_log(steps) + '{"x": 1, "event":"admission.defer"}\n'
    p = [tmp_path / "a.log"]
    if per_rank:
        lines = text.splitlines(keepends=True)
        p[0].write_text("".join(x for x in lines if '"rank": 1' not in x))
        p.append(tmp_path / "b.log.gz")
        p[1].write_bytes(gzip.compress("".join(x for x in lines if '"rank": 1' in x).encode()))
    else:
        p[0].write_text(text)
    specs = [load_spec(s) for s in shipped()]
    one = verdict._evaluate(specs, p, None, False, False, False)[1]
    first = [i for i, s in enumerate(specs) if where[i] or verdict._wanted(_bus(s)) is None]
    other = [i for i in range(len(specs)) if i not in first]
    handed: list = []
    got = dict(
        zip(
            first,
            verdict._evaluate(
                [specs[i] for i in first], p, None, False, False, False, send=handed.append
            )[1],
        )
    )
    got |= dict(
        zip(
            other,
            verdict._evaluate(
                [specs[i] for i in other], p, None, False, False, False, receive=lambda: handed[0]
            )[1],
        )
    )
    assert len(handed) == 1
    assert [_as_dict(got[i]) for i in range(len(specs))] == [_as_dict(o) for o in one]


def _bus(spec):
    from audit import verdict
    from audit.checker import Bus

    bus = Bus()
    verdict._subscribe([spec], bus)
    return bus


def _as_dict(outcome):
    return outcome if isinstance(outcome, tuple) else outcome.as_dict()


def test_every_self_test_case_gets_the_same_verdict_with_the_compiled_receivers_and_without():
    """The whole verdict, byte for byte, on every shipped spec's cases, with the compiled
    receivers (follow-up windows, the wedge detector) and with Python's own."""
    cases = [(spec, p) for spec in map(load_spec, shipped()) for p in case_paths(spec)]
    assert len(cases) > 100
    for spec, case in cases:
        with case_files(case) as (_, log, control):
            compiled = to_json(evaluate([spec], [log], control))
            with pytest.MonkeyPatch.context() as m:
                m.setattr(native, "fast_follower", lambda: None)
                m.setattr(native, "fast_feeder", lambda: None)
                python = to_json(evaluate([spec], [log], control))
        assert compiled == python, case.name
