"""The auditor under fuzz. Whatever a log holds (random bytes; lines cut, doubled, lost or
swapped; numbers no engine writes; values nested past any schema; invalid UTF-8), ``audit
verdict`` reads it to a verdict, never an internal error (a gzip stream it cannot read is
sysexits 66 with the reason); and a log that lost a receipt line gets no PASS from any claim that
needs every receipt: the seq gap shows. The logs are the shipped self-test cases, mangled."""

from __future__ import annotations

import contextlib
import io
import re
import tomllib
from functools import cache
from pathlib import Path

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from audit.reader import UnreadableLog
from audit.render import print_report, to_json, to_junit
from audit.spec import acceptance_dir, load_spec, shipped
from audit.status import Status
from audit.verdict import Report, evaluate
from cli.audit_app import main

SPECS = [load_spec(p) for p in shipped()]
LOGS = {
    f"{c.parent.parent.name}/{c.stem}": tomllib.loads(c.read_text(encoding="utf-8"))["log"]
    for c in sorted(acceptance_dir().glob("*/cases/*.toml"))
}
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def deep(n: int, pair: str = "[]") -> bytes:
    return (pair[0] * n + pair[1] * n).encode()


# values no engine writes, each put where a field's value was
HOSTILE = [
    b"1" + b"0" * 400,  # 10**400: no JSON reader holds it as a number
    b"18446744073709551616",  # 2**64
    b"-9223372036854775809",
    b"-1",
    b"1.5",  # a float where the schema has an int
    b"1e308",
    b"-1e308",
    b"true",
    b"null",
    b'"x"',
    b"[]",
    b"{}",
    deep(100_000),  # past any JSON reader's depth limit: the line does not parse
    deep(1020),  # within the JSON reader's limit, past what Python recursion can walk
    b'{"a":' * 1020 + b"1" + b"}" * 1020,
    deep(300),
    b'"' + b"a" * 100_000 + b'"',
    b'"\\ud800"',  # a lone surrogate
    b'"\xff\xfe"',  # invalid UTF-8
]
_FIELD = re.compile(rb'"[a-z_]+":("(?:[^"\\]|\\.)*"|[-0-9.eE+]+|true|false|null)')


def read(tmp_path: Path, data: bytes) -> Report | None:
    """The report on a log of these bytes, rendered every way the CLI renders it; None for a
    gzip stream that cannot be read (the only thing that may stop a verdict)."""
    p = tmp_path / "boot.log"
    p.write_bytes(data)
    try:
        report = evaluate(SPECS, [p], only_applicable=True)
    except UnreadableLog:
        assert data[:2] == b"\x1f\x8b", "only a gzip stream is unreadable once the file opens"
        return None
    orjson.loads(to_json(report))
    to_junit(report)
    print_report(report, Console(file=io.StringIO(), width=140))
    return report


def cli(*args: str) -> tuple[int, str, str]:
    """``audit ARGS`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as e:
            return int(e.code or 0), out.getvalue(), err.getvalue()
    raise AssertionError("main returned without an exit code")


def mangle(text: str, ops: list[tuple]) -> bytes:
    lines = text.encode().split(b"\n")
    for op, i, j, what in ops:
        i %= len(lines)
        if op == "lose":
            del lines[i]
        elif op == "twice":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][: j % (len(lines[i]) + 1)]
        elif op == "swap":
            j %= len(lines)
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "bytes":
            lines[i] = (
                lines[i][: j % (len(lines[i]) + 1)] + what + lines[i][j % (len(lines[i]) + 1) :]
            )
        elif op == "value":  # j: which field, by its place or its name
            fields = list(_FIELD.finditer(lines[i]))
            if isinstance(j, str):
                fields = [m for m in fields if m.group(0).startswith(f'"{j}":'.encode())]
                j = 0
            if fields:
                m = fields[j % len(fields)]
                lines[i] = lines[i][: m.start(1)] + what + lines[i][m.end(1) :]
        if not lines:
            lines = [b""]
    return b"\n".join(lines)


index = st.integers(0, 10**6)
op = st.one_of(
    st.tuples(st.sampled_from(["lose", "twice", "cut", "swap"]), index, index, st.just(b"")),
    st.tuples(st.just("value"), index, index, st.sampled_from(HOSTILE)),
    st.tuples(st.just("bytes"), index, index, st.binary(min_size=1, max_size=40)),
)


@FUZZ
@given(st.binary(max_size=3000), st.sampled_from([b"", b"\x1f\x8b", b"{", b'{"event":']))
def test_any_bytes_give_a_verdict(tmp_path, data, head):
    read(tmp_path, head + data)


@FUZZ
@given(st.sampled_from(sorted(LOGS)), st.lists(op, min_size=1, max_size=4))
@example("no_request_lost/pass", [("value", 4, "rid", deep(1020))])  # a key, 1020 lists deep
@example("admission_park/pass", [("value", 10, "rid", b'{"a":' * 1020 + b"1" + b"}" * 1020)])
@example("boot_health/stuck", [("value", 8, "waiting", deep(1020))])  # a wedge span opens
@example("eviction_honesty/pass", [("value", 6, "evicted", deep(1020))])  # an invariant operand
def test_a_mangled_real_log_gives_a_verdict(tmp_path, case, ops):
    read(tmp_path, mangle(LOGS[case], ops))


def test_a_value_nested_past_what_python_walks_is_undecided_not_an_internal_error(tmp_path):
    log = tmp_path / "boot.log"
    log.write_bytes(mangle(LOGS["admission_park/pass"], [("value", 10, "rid", deep(1020))]))
    code, out, err = cli("verdict", str(log), "--json")
    assert (code, err) == (2, ""), err
    got = orjson.loads(out)
    assert got["incomplete"]["reason"] == "malformed_receipts"
    assert "1 receipt(s) nest a value deeper than 256 levels" in got["incomplete"]["why"]
    assert got["read"]["malformed"] == 1


def test_an_unreadable_gzip_is_66_with_the_reason_and_no_traceback(tmp_path):
    log = tmp_path / "boot.log.gz"
    log.write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    code, out, err = cli("verdict", str(log))
    assert code == 66 and err.startswith("audit: cannot read log:") and "Traceback" not in err


# -- a lost line never passes -------------------------------------------------------------------


@cache
def complete() -> list[str]:
    """The cases whose receipts hold seq 1..n once on each (boot, rank), some rank two or more:
    nothing lost yet, and a line to lose that a later one of its rank shows."""
    out = []
    for name, text in sorted(LOGS.items()):
        seqs: dict[tuple, list] = {}
        for _, boot, rank, seq in receipts(text):
            seqs.setdefault((boot, rank), []).append(seq)
        whole = all(s == list(range(1, len(s) + 1)) for s in map(sorted, seqs.values()))
        if whole and any(len(s) > 1 for s in seqs.values()):
            out.append(name)
    return out


def receipts(text: str) -> list[tuple[int, str, int, int]]:
    """(line index, boot, rank, seq) of each receipt line (boot, rank and seq as written: a seq
    that is not an integer shows as -1, which no whole run of seqs holds)."""
    out = []
    for i, line in enumerate(text.split("\n")):
        try:
            r = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(r, dict) and "event" in r and "v" in r:
            seq = r.get("seq")
            out.append(
                (i, repr(r.get("boot")), repr(r.get("rank")), seq if type(seq) is int else -1)
            )
    return out


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data(), st.sampled_from(["lose", "cut", "twice"]))
def test_a_log_that_lost_a_receipt_line_passes_no_claim_that_needs_them_all(tmp_path, data, how):
    case = data.draw(st.sampled_from(complete()))
    text = LOGS[case]
    got = receipts(text)
    top = {}
    for _, boot, rank, seq in got:
        top[(boot, rank)] = max(seq, top.get((boot, rank), 0))
    # a later receipt of the same rank is what shows the loss (a log cut after its last
    # receipt is an engine still running, as far as any reader can tell)
    shown = [i for i, boot, rank, seq in got if seq < top[(boot, rank)]]
    i = data.draw(st.sampled_from(shown))
    lines = text.split("\n")
    if how == "lose":
        del lines[i]
    elif how == "cut":
        lines[i] = lines[i][: data.draw(st.integers(1, len(lines[i]) - 1))]
    else:
        lines.insert(i, lines[i])
    report = read(tmp_path, "\n".join(lines).encode())
    assert report is not None
    reason = "seq_duplicate" if how == "twice" else "seq_gap"
    assert report.stats.incomplete()[0] == reason
    passed = [
        f"{s.spec}/{c.claim}"
        for s in report.specs
        for c in s.claims
        if c.status is Status.PASS and c.kind != "engaged"  # seeing a mechanism engage holds
    ]
    assert passed == [], f"{case}: {how} line {i + 1} and still PASS: {passed}"
