"""A verdict read in several processes, each for a share of the windows, is the verdict read in
one: the same report, the specs in their order; a share's failure is raised in the caller.

What forks runs in a process of its own (``fresh``): this one may hold other tests' threads, and
the auditor does not fork a process with threads running."""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

import orjson
import pytest

from audit import apart
from audit.reader import head_receipts
from tests.unit.audit_logs import LogText


def a_log(tmp_path):
    log = LogText().ready()
    for n in range(40):
        log.received(f"r-{n}").park(f"r-{n}").r("admission.unpark", rid=f"r-{n}", tokens=4)
        log.finish(f"r-{n}")
    log.received("r-lost").stop()  # no_request_lost fails: the report has every kind of verdict
    return log.write(tmp_path / "boot.log")


def fresh(code: str) -> object:
    """What ``code`` prints (as JSON), run in a new interpreter with one thread."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return orjson.loads(r.stdout)


@pytest.mark.parametrize("only_applicable", [True, False])
def test_the_specs_shared_among_processes_give_the_report_of_one(tmp_path, only_applicable):
    log = a_log(tmp_path)
    one, three, jobs = fresh(
        "import orjson\n"
        "from audit import apart\n"
        "from audit.spec import load_spec, shipped\n"
        "from audit.verdict import evaluate\n"
        "specs = [load_spec(p) for p in shipped()]\n"
        f"logs, only = [{str(log)!r}], {only_applicable}\n"
        "jobs = apart.jobs_for(3, logs, len(specs))\n"  # the shares do run apart
        "one = evaluate(specs, logs, only_applicable=only).as_dict()\n"
        "three = evaluate(specs, logs, only_applicable=only, jobs=3).as_dict()\n"
        "print(orjson.dumps([one, three, jobs]).decode())\n"
    )
    assert jobs == 3 and three == one
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
    got = fresh(
        "import orjson\n"
        "from audit import apart\n"
        "def bad():\n"
        "    raise ValueError('share two broke')\n"
        "out = [apart.run([lambda: 1, lambda: 2, lambda: 3])]\n"
        "try:\n"
        "    apart.run([lambda: 1, bad])\n"
        "except ValueError as e:\n"
        "    out.append(str(e))\n"
        "print(orjson.dumps(out).decode())\n"
    )
    assert got == [[1, 2, 3], "share two broke"]


def test_small_logs_and_threaded_callers_read_in_one_process(tmp_path):
    logs = [a_log(tmp_path)]
    assert apart.jobs_for(0, logs, 12) == 1  # under MIN_BYTES: the fork costs what it saves
    assert apart.jobs_for(4, logs, 1) == 1  # one share: nothing to fork for
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert apart.jobs_for(4, logs, 12) == 1  # forking a threaded process is not safe
    finally:
        stop.set()
        t.join()


def test_a_share_that_reads_part_of_the_log_is_given_what_the_first_cannot_hold():
    kinds = [frozenset({"a"}), frozenset({"b"}), frozenset(), frozenset({"a", "b"})]
    part = {"a": 0.7, "b": 0.1}

    def fraction(ks):
        return sum(part[k] for k in ks)

    # the first share reads everything (10); the second only what its specs read. Dearest
    # first: 0 goes second (7 + 3 < 10 + 3), then 1 first (13 < 8 + 6), 2 (it needs every
    # line) first, 3 second (8 + 4 < 10 + 7)
    shares = apart.share_out(
        [3, 3, 3, 1], 2, read=10, kinds=kinds, fraction=fraction, movable=[1, 1, 0, 1]
    )
    assert shares == [[1, 2], [0, 3]]
    assert apart.share_out(
        [3, 3], 2, read=100, kinds=kinds[:2], fraction=fraction, movable=[1, 1]
    ) == [[], [0, 1]]
    assert apart.share_out([3, 3], 3, movable=[0, 0]) == [[0, 1]]  # an empty other is dropped


def test_windows_that_share_state_on_a_bus_are_planned_together():
    from audit.spec import load_spec, shipped
    from audit.verdict import _together

    specs = [load_spec(p) for p in shipped()]
    groups = [[specs[i].name for i in g] for g in _together(specs)]
    assert sorted(i for g in _together(specs) for i in g) == list(range(len(specs)))
    # each reads request.received -> request.finish | abort on the same followups
    together = next(g for g in groups if "no_request_lost" in g)
    assert {"speculation", "cutover", "phase_flip", "group_agreement"} <= set(together)
    assert ["boot_health"] in groups  # it shares nothing


def test_the_plan_times_a_warm_reading_of_the_head(tmp_path, monkeypatch):
    """The first reading in a process pays for what it loads and fills once (the compiled loop,
    the parser's key cache, the file's pages): timed, it made skipping look dearer to pass up
    than it is, and the same log got another plan on each call. The reading timed is a second."""
    from audit import verdict
    from audit.spec import load_spec, shipped

    log, clock, reads, told = a_log(tmp_path), [0.0], [], {}
    real = verdict.head_receipts

    def head(path, size):  # the first reading takes 100 "seconds", each other 1
        clock[0] += 100.0 if not reads else 1.0
        reads.append(path)
        return real(path, size)

    def share_out(costs, n, **kw):
        told.update(kw)
        return [list(range(len(costs)))]

    monkeypatch.setattr(verdict, "head_receipts", head)
    monkeypatch.setattr(verdict.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(verdict, "native", SimpleNamespace(fast_run=object))  # plans skipping
    monkeypatch.setattr(apart, "share_out", share_out)
    verdict._plan([load_spec(p) for p in shipped()], log, 2)
    assert told["read"] == 1.0 and len(reads) == 2
