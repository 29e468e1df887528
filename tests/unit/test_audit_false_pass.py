"""The false-PASS regression and order independence, over every shipped window's cases.

Unrelated text, foreign JSON and receipts of other kinds that carry the same words, kinds or
field names as the real receipts never change a verdict; nor does the order in which the lines
of different ranks are interleaved, or splitting a log into one file per rank."""

from __future__ import annotations

import tomllib
from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.spec import load_spec, shipped
from audit.verdict import evaluate

CASES = [
    (window, case) for window in shipped() for case in sorted((window / "cases").glob("*.toml"))
]

DECOY_TEXT = [
    "INFO ack-service: 72 acknowledgements, acked=72 status=PASS",
    "worker: admission.park rid=r-1 reason=below_page need=40 (simulated)",
    '2026-11-29 INFO saw "event":"request.finish","rid":"r-2" in a replay',
    "test_oom.py: expecting alloc.oom and Traceback (most recent call last): in this test",
    "no Segmentation fault (core dumped) since boot; terminate called 0 times",
    "eviction.under_delivered=0 evicted=0 asked=10 evictable_before=50",
]
DECOY_JSON = [
    {"event": "request.finish", "rid": "r-1", "reason": "length", "tokens": 3},
    {"event": "admission.park", "rid": "r-1", "need": 40, "fundable": 0, "remaining": 99},
    {"event": "alloc.oom", "need": 1, "available": 0, "acked": 72},
    {"event": "relief.engage", "shortfall": 4, "v": 1, "rank": 0},  # no boot, no seq: not ours
    {"msg": "retract", "rids": ["r-1", "r-2"], "seq": 3, "boot": "b-0000000a"},
]


def decoy_receipts(n: int) -> list[str]:
    """Receipts of an unrelated kind, from an unrelated boot, carrying the same field names."""
    out = []
    for i in range(n):
        rec = {
            "ts": 1.0 + i,
            "event": "notice",
            "v": 1,
            "boot": "b-decoy000",
            "rank": 0,
            "iter": 1,
            "seq": i + 1,
            "text": "admission.park request.finish alloc.oom",
            "rid": "r-1",
            "rids": ["r-2"],
            "evicted": 0,
            "asked": 99,
            "parks": 72,
        }
        out.append(orjson.dumps(rec).decode())
    return out


def verdicts(window: Path, logs: list[Path], control: Path | None = None) -> dict:
    report = evaluate([load_spec(window)], logs, control)
    return {c.claim: (c.status.value, c.reason) for c in report.specs[0].claims}


def case_logs(case: Path, d: Path) -> tuple[list[str], Path | None]:
    t = tomllib.loads(case.read_text())
    control = None
    if "control" in t:
        control = d / "control.log"
        control.write_text(t["control"])
    return t["log"].splitlines(), control


@settings(max_examples=25)
@given(st.data())
def test_decoys_never_change_a_verdict(tmp_path_factory, data):
    window, case = data.draw(st.sampled_from(CASES))
    d = tmp_path_factory.mktemp("decoy")
    lines, control = case_logs(case, d)
    (d / "clean.log").write_text("\n".join(lines) + "\n")
    decoys = DECOY_TEXT + [orjson.dumps(j).decode() for j in DECOY_JSON]
    picked = data.draw(st.lists(st.sampled_from(decoys), max_size=12))
    picked += decoy_receipts(data.draw(st.integers(1, 4)))  # a whole (gap-free) unrelated boot
    mixed = list(lines)
    for decoy in picked:
        mixed.insert(data.draw(st.integers(0, len(mixed))), decoy)
    (d / "mixed.log").write_text("\n".join(mixed) + "\n")
    clean = verdicts(window, [d / "clean.log"], control)
    assert verdicts(window, [d / "mixed.log"], control) == clean


def test_every_decoy_at_once_next_to_every_case(tmp_path):
    others = DECOY_TEXT + [orjson.dumps(j).decode() for j in DECOY_JSON]
    # the unrelated boot's receipts once: read twice, they would be a duplicate of its own
    decoys = others + decoy_receipts(6) + others * 10
    for window, case in CASES:
        lines, control = case_logs(case, tmp_path)
        (tmp_path / "clean.log").write_text("\n".join(lines) + "\n")
        mixed = [x for pair in zip(lines, decoys) for x in pair]
        (tmp_path / "mixed.log").write_text("\n".join(mixed) + "\n")
        want = verdicts(window, [tmp_path / "clean.log"], control)
        assert verdicts(window, [tmp_path / "mixed.log"], control) == want, case


def by_rank(lines: list[str]) -> dict[object, list[str]]:
    streams: dict[object, list[str]] = {}
    for line in lines:
        rank = orjson.loads(line).get("rank") if line.startswith("{") else "text"
        streams.setdefault(rank, []).append(line)
    return streams


MULTI = [
    (w, c) for w, c in CASES if len(by_rank(tomllib.loads(c.read_text())["log"].splitlines())) > 1
]


def test_there_are_multi_rank_cases_to_shuffle():
    assert len(MULTI) >= 3


@settings(max_examples=25)
@given(st.data())
def test_a_verdict_never_depends_on_how_ranks_are_interleaved(tmp_path_factory, data):
    window, case = data.draw(st.sampled_from(MULTI))
    d = tmp_path_factory.mktemp("order")
    lines, control = case_logs(case, d)
    (d / "as_written.log").write_text("\n".join(lines) + "\n")
    want = verdicts(window, [d / "as_written.log"], control)
    streams = {k: list(v) for k, v in by_rank(lines).items()}
    merged = []
    while streams:  # a random interleaving that keeps each rank's own order
        k = data.draw(st.sampled_from(sorted(streams, key=str)))
        merged.append(streams[k].pop(0))
        if not streams[k]:
            del streams[k]
    (d / "shuffled.log").write_text("\n".join(merged) + "\n")
    assert verdicts(window, [d / "shuffled.log"], control) == want
    files = []
    for k, part in by_rank(lines).items():  # one file per rank, in any file order
        files.append(d / f"rank-{k}.log")
        files[-1].write_text("\n".join(part) + "\n")
    order = data.draw(st.permutations(files))
    assert verdicts(window, list(order), control) == want
