"""The ``prior`` claim kind: each selected record checked against what came before it on its
(boot, rank) and key: running sums of earlier records, and the last earlier record of a kind.
Decided in seq order whatever the order the lines were read in."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from audit.checker import Bus
from audit.kinds import build_checker
from audit.parse import SpecError, parse_spec
from audit.reader import scan
from audit.spec import resolve
from audit.verdict import evaluate, receivers
from tests.unit.audit_logs import LogText


def census(*rids: str) -> dict:
    return {"running": list(rids), "parked": [], "waiting": [], "rids": list(rids), "backlog": 0}


def cutover(log: LogText, cid: str, before: tuple[str, ...], after: tuple[str, ...]) -> LogText:
    log.r(
        "cutover.begin",
        id=cid,
        kind="pool",
        mode="carry",
        kv_tokens=64,
        ceiling=9,
        **census(*before),
    )
    return log.r(
        "cutover.end",
        id=cid,
        kind="pool",
        mode="carry",
        outcome="ok",
        status=200,
        **census(*after),
        ended=[],
        backlog_before=0,
        rids_before=list(before),
        ceiling=9,
    )


def test_a_rid_dropped_by_one_cutover_and_listed_by_a_later_one_fails_the_census(tmp_path):
    log = LogText().ready().received("r-0").received("r-1")
    cutover(log, "c-1", ("r-0", "r-1"), ("r-0",))  # r-1 is in no state after c-1
    cutover(log, "c-2", ("r-0", "r-1"), ("r-0", "r-1"))  # and back again in c-2's census
    log.finish("r-0").finish("r-1").stop()
    report = evaluate([resolve("cutover")], [log.write(tmp_path / "b.log")])
    v = next(c for c in report.specs[0].claims if c.claim == "census_accounted_for")
    assert v.status.value == "FAIL", v.why
    assert "id c-1" in v.why or "c-1" in v.why


def decide(tmp_path: Path, claim: str, *logs: LogText):
    spec = parse_spec('description = "t"\n[[claim]]\nid = "c"\n' + claim, Path("t/spec.toml"))
    files = [log.write(tmp_path / f"b{i}.log") for i, log in enumerate(logs)]
    return evaluate([spec], files).specs[0].claims[0]


HOST = """kind = "prior"
select = [{ kind = "tier.load" }, { kind = "tier.drop" }]
sum = { spilled = { select = { kind = "tier.spill" }, field = "tokens" }, dropped = { select = { kind = "tier.drop" }, field = "tokens" } }
check = "tokens <= spilled - dropped"
"""


def spill(log: LogText, n: int) -> LogText:
    return log.r("tier.spill", tokens=n, bytes=n * 8, seconds=0.001, nodes=1, dropped=0)


def load(log: LogText, n: int) -> LogText:
    return log.r("tier.load", tokens=n, bytes=n * 8, seconds=0.001, nodes=1, rid="r-1", asked=n)


def drop(log: LogText, n: int) -> LogText:
    return log.r("tier.drop", reason="spill", tokens=n, nodes=1, need=n, host_free=0)


def test_sums_count_only_records_before_the_checked_one(tmp_path):
    log = spill(LogText().ready(), 32)
    load(log, 32)  # all of it: fine
    drop(log, 32)  # a drop is not before itself: 32 <= 32 - 0
    load(log, 16).stop()  # nothing left on the host
    v = decide(tmp_path, HOST, log)
    assert v.status.value == "FAIL" and v.numbers == {"checked": 3, "broken": 1, "unevaluable": 0}
    assert "tier.load (boot b-00000001 rank 0 seq 6" in v.why
    assert "tokens <= spilled - dropped: 16 <= 32 - 32" in v.why


def test_a_load_is_judged_in_seq_order_whatever_the_order_of_the_lines(tmp_path):
    log = spill(LogText().ready(), 32)
    load(log, 32).stop()
    v = decide(tmp_path, HOST, log)
    assert v.status.value == "PASS" and v.numbers["checked"] == 1
    lines = str(log).splitlines()
    reversed_log = LogText()
    reversed_log.lines = lines[::-1]
    assert decide(tmp_path, HOST, reversed_log).status.value == "PASS"
    first, second = LogText(), LogText()  # the same boot in two files, the later one first
    first.lines, second.lines = lines[:3], lines[3:]
    assert decide(tmp_path, HOST, second, first).status.value == "PASS"


def test_an_incomplete_log_is_undecided_before_a_sum_can_be_read_short(tmp_path):
    log = LogText().ready()
    log.r("tier.spill", lose=True, tokens=32, bytes=256, seconds=0.001)
    load(log, 32).stop()
    v = decide(tmp_path, HOST, log)
    assert (v.status.value, v.reason) == ("UNDECIDED", "seq_gap")


def test_nothing_selected_is_no_engagement(tmp_path):
    v = decide(tmp_path, HOST, spill(LogText().ready(), 8).stop())
    assert (v.status.value, v.reason) == ("UNDECIDED", "no_engagement")


PAIR = """kind = "prior"
select = { kind = "cutover.end" }
key = "id"
last = { begin = { kind = "cutover.begin" } }
check = "outside(begin.rids, rids) == 0"
"""


def test_an_end_is_judged_against_the_begin_of_its_own_id(tmp_path):
    log = LogText().ready()
    cutover(log, "c-1", ("r-0",), ("r-0",))
    cutover(log, "c-2", ("r-1",), ("r-0",))  # c-2's census was r-1, its end lost it
    v = decide(tmp_path, PAIR, log.stop())
    assert v.status.value == "FAIL" and "(id c-2)" in v.why
    assert "outside(['r-1'], ['r-0']) == 0" in v.why


def test_an_end_without_its_begin_cannot_be_checked(tmp_path):
    log = LogText().ready()
    log.r(
        "cutover.end",
        id="c-9",
        kind="pool",
        mode="carry",
        outcome="ok",
        **census("r-0"),
        backlog_before=0,
    )
    v = decide(tmp_path, PAIR, log.stop())
    assert (v.status.value, v.reason) == ("UNDECIDED", "missing_field")
    assert "(id c-9): no earlier cutover.begin" in v.why


def test_a_long_list_is_cut_short_in_the_sentence(tmp_path):
    rids = tuple(f"r-{i}" for i in range(20))
    log = LogText().ready()
    cutover(log, "c-1", rids, rids[:-1])
    v = decide(tmp_path, PAIR, log.stop())
    assert v.status.value == "FAIL" and "(20 items)" in v.why and "r-15" not in v.why


@pytest.mark.parametrize(
    ("claim", "said"),
    [
        (
            'kind = "prior"\nselect = { kind = "tier.load" }\ncheck = "tokens <= 1"\n',
            "needs 'sum' or 'last'",
        ),
        (HOST.replace("spilled =", "tokens ="), "'tokens' is a field of the selected records"),
        (PAIR.replace('key = "id"', 'key = "rid"'), "has no field 'rid'"),
        (PAIR.replace("begin.rids", "begin.nope"), "begin.nope"),
        (
            PAIR.replace(
                "last = { begin",
                'sum = { begin = { select = { kind = "tier.load" }, field = "tokens" } }\nlast = { begin',
            ),
            "a sum and a last record",
        ),
    ],
)
def test_a_prior_claim_names_only_what_exists(claim, said):
    with pytest.raises(SpecError, match=re.escape(said)):
        parse_spec('description = "t"\n[[claim]]\nid = "c"\n' + claim, Path("t/spec.toml"))


def test_a_cutover_refused_while_another_runs_does_not_stand_in_for_its_begin(tmp_path):
    """c-2 is asked while c-1 runs: its begin and its refusal come between c-1's begin and end;
    c-1's end is judged against c-1's census, not the later one."""
    log = LogText().ready()
    begin = {"kind": "pool", "mode": "carry", "kv_tokens": 64, "ceiling": 9}
    log.r("cutover.begin", id="c-1", **begin, **census("r-0", "r-1"))
    log.r("cutover.begin", id="c-2", **begin, **census("r-0"))
    log.r("cutover.end", id="c-2", kind="pool", mode="carry", outcome="rejected", **census("r-0"))
    log.r("cutover.end", id="c-1", kind="pool", mode="carry", outcome="ok", **census("r-0"))
    v = decide(tmp_path, PAIR, log.stop())
    assert v.status.value == "FAIL" and "(id c-1)" in v.why, v.why


def test_a_log_in_seq_order_is_checked_as_it_is_read_holding_no_record(tmp_path):
    """The sums and the last records are all a prior claim holds while a log in seq order is
    read: its memory does not grow with the records it checks."""
    log = spill(LogText().ready(), 32)
    for _ in range(20):
        load(log, 1)
    spec = parse_spec('description = "t"\n[[claim]]\nid = "c"\n' + HOST, Path("t/spec.toml"))
    bus = Bus()
    (checker,) = [build_checker(c, bus) for c in spec.claims]
    scan([log.stop().write(tmp_path / "b.log")], routes=receivers(bus))
    assert checker.seen == {} and not checker.rescan(None)
    (st,) = checker.ats.values()
    assert st.checked == 20 and dict(st.sums) == {None: {"spilled": 32, "dropped": 0}}
