"""A verdict read in several processes, each for a share of the windows, is the verdict read in
one: the same report, the specs in their order; a share's failure is raised in the caller."""

from __future__ import annotations

import threading

import pytest

from audit import apart
from audit.reader import head_receipts
from audit.spec import load_spec, shipped
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText


def a_log(tmp_path):
    log = LogText().ready()
    for n in range(40):
        log.received(f"r-{n}").park(f"r-{n}").r("admission.unpark", rid=f"r-{n}", tokens=4)
        log.finish(f"r-{n}")
    log.received("r-lost").stop()  # no_request_lost fails: the report has every kind of verdict
    return log.write(tmp_path / "boot.log")


@pytest.mark.parametrize("only_applicable", [True, False])
def test_the_specs_shared_among_processes_give_the_report_of_one(tmp_path, only_applicable):
    specs = [load_spec(p) for p in shipped()]
    logs = [a_log(tmp_path)]
    assert apart.jobs_for(3, logs, len(specs)) == 3  # the shares do run apart here
    one = evaluate(specs, logs, only_applicable=only_applicable).as_dict()
    three = evaluate(specs, logs, only_applicable=only_applicable, jobs=3).as_dict()
    assert three == one
    assert one["verdict"] == "FAIL" and (one["not_applicable"] != []) == only_applicable


def test_shares_are_even_by_cost_and_hold_every_spec_once():
    for costs in ([5, 5, 5, 8, 4, 4, 3, 10, 7, 5, 7, 5], [1, 1], [9, 1, 1, 1], [0] * 7, [3, 0, 0]):
        for n in range(1, len(costs) + 2):
            shares = apart.share_out(costs, n)
            assert len(shares) == min(n, len(costs)) and all(shares), (costs, n, shares)
            assert sorted(i for s in shares for i in s) == list(range(len(costs)))
            assert all(s == sorted(s) for s in shares)
    assert apart.share_out([9, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    assert apart.share_out([0.45, 0.35, 0.25, 0.21, 0.21, 0.16], 2) == [[0, 3, 5], [1, 2, 4]]


def test_the_head_of_a_log_gives_the_receipts_its_claims_would_get(tmp_path):
    log = LogText().ready()
    for n in range(20):
        log.received(f"r-{n}").finish(f"r-{n}")
    log.text("a plain line").r("request.finish", rid="r-x")  # without its required fields
    path = log.write(tmp_path / "boot.log")
    got = head_receipts(path, 1 << 20)
    assert [r["event"] for r in got[:4]] == [
        "boot.start",
        "boot.ready",
        "request.received",
        "request.finish",
    ]
    assert len(got) == 42 and all(r.get("rid") != "r-x" for r in got)
    cut = len(str(log).splitlines()[0]) + 10  # the first line whole, the second cut
    assert [r["event"] for r in head_receipts(path, cut)] == ["boot.start"]
    assert head_receipts(tmp_path / "missing.log", 1 << 20) == []


def test_a_failure_in_a_share_is_raised_in_the_caller():
    def bad() -> int:
        raise ValueError("share two broke")

    assert apart.run([lambda: 1, lambda: 2, lambda: 3]) == [1, 2, 3]
    with pytest.raises(ValueError, match="share two broke"):
        apart.run([lambda: 1, bad])


def test_small_logs_and_threaded_callers_read_in_one_process(tmp_path):
    logs = [a_log(tmp_path)]
    assert apart.jobs_for(0, logs, 12) == 1  # under MIN_BYTES: the fork costs what it saves
    assert apart.jobs_for(4, logs, 1) == 1 and apart.jobs_for(4, logs, 3) == 3
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert apart.jobs_for(4, logs, 12) == 1  # forking a threaded process is not safe
    finally:
        stop.set()
        t.join()
