"""`audit diff`: what it computes from two small logs (counts per kind, verdicts, latency
percentiles, pool peaks), and what it calls a change."""

from __future__ import annotations

import io

import orjson
from rich.console import Console

from audit.diff import NA, Row, compare, diff_table, to_json
from audit.report_data import percentile
from tests.unit.audit_logs import LogText


def test_percentile_is_nearest_rank_a_value_that_occurred():
    values = [float(v) for v in range(10, 0, -1)]  # unsorted on purpose
    assert [percentile(values, p) for p in (50, 90, 99, 100)] == [5.0, 9.0, 10.0, 10.0]
    assert percentile([0.3], 50) == percentile([0.3], 99) == 0.3
    assert percentile([], 50) is None


def baseline() -> LogText:
    """Two requests end with timings; one iteration receipt without ``parked``."""
    log = LogText().ready()
    for rid in ("r-1", "r-2"):
        log.received(rid)
    log.r("iteration", running=2, waiting=0, token_usage=0.5)
    log.finish("r-1", ttft_s=0.010, e2e_s=0.100)
    log.finish("r-2", ttft_s=0.030, e2e_s=0.300)
    return log.stop()


def regressed() -> LogText:
    """Three requests, one parks, one never ends (lost after boot.stop); fuller pool, slower."""
    log = LogText().ready()
    for rid in ("r-1", "r-2", "r-3"):
        log.received(rid)
    log.park("r-3")
    log.r("iteration", running=2, waiting=1, parked=1, token_usage=0.75)
    log.r("iteration", running=1, waiting=0, parked=0, token_usage=0.9)
    log.finish("r-1", ttft_s=0.020, e2e_s=0.100)
    log.finish("r-2", ttft_s=0.060, e2e_s=0.300)
    return log.stop()


def rows_by_name(d) -> dict[tuple[str, str], Row]:
    return {(r.section, r.name): r for r in d.rows}


def test_counts_latency_and_pool_peaks_of_each_side(tmp_path):
    d = compare(baseline().write(tmp_path / "a.log"), regressed().write(tmp_path / "b.log"))
    rows = rows_by_name(d)
    got = {
        k: (rows[k].a, rows[k].b, rows[k].delta())
        for k in [
            ("receipts", "request.received"),
            ("receipts", "admission.park"),
            ("receipts", "request.finish"),
            ("latency", "ttft_s n"),
            ("latency", "ttft_s p50"),
            ("latency", "ttft_s p99"),
            ("latency", "e2e_s p90"),
            ("pool", "iteration receipts"),
            ("pool", "token_usage max"),
            ("pool", "waiting max"),
            ("pool", "parked max"),
            ("read", "complete"),
        ]
    }
    assert got == {
        ("receipts", "request.received"): (2, 3, "+1"),
        ("receipts", "admission.park"): (0, 1, "+1"),  # a kind only one side has counts 0
        ("receipts", "request.finish"): (2, 2, ""),
        ("latency", "ttft_s n"): (2, 2, ""),
        ("latency", "ttft_s p50"): (0.010, 0.020, "+100%"),
        ("latency", "ttft_s p99"): (0.030, 0.060, "+100%"),
        ("latency", "e2e_s p90"): (0.300, 0.300, ""),
        ("pool", "iteration receipts"): (1, 2, "+1"),
        ("pool", "token_usage max"): (0.5, 0.9, "+40.0 pp"),
        ("pool", "waiting max"): (0, 1, "+1"),
        ("pool", "parked max"): (None, 1, "only in B"),  # A's receipts never carried it
        ("read", "complete"): ("yes", "yes", ""),
    }


def test_verdicts_of_every_shipped_window_and_the_claim_that_changed(tmp_path):
    d = compare(baseline().write(tmp_path / "a.log"), regressed().write(tmp_path / "b.log"))
    rows = rows_by_name(d)
    lost = rows[("claims", "no_request_lost.every_request_ends")]
    assert (lost.a, lost.b, lost.delta(), lost.style()) == (
        "PASS",
        "FAIL",
        "PASS -> FAIL",
        "bold red",
    )
    assert (rows[("verdicts", "no_request_lost")].a, rows[("verdicts", "no_request_lost")].b) == (
        "PASS",
        "FAIL",
    )
    assert rows[("verdicts", "overall")].b == "FAIL"
    assert {n for s, n in rows if s == "verdicts"} >= {"overall", "boot_health", "admission_park"}
    better = Row("verdicts", "w", "FAIL", "UNDECIDED", "verdict")
    assert better.style() == "bold green"  # FAIL > UNDECIDED > PASS: this one got better


def test_a_log_no_window_applies_to_is_na_and_named_specs_are_always_decided(tmp_path):
    text = tmp_path / "text.log"
    text.write_text("another engine's log\n")
    b = regressed().write(tmp_path / "b.log")
    rows = rows_by_name(compare(text, b))
    assert rows[("verdicts", "no_request_lost")].a == NA
    assert rows[("claims", "no_request_lost.every_request_ends")].a is None  # never asked
    assert rows[("verdicts", "overall")].a == "UNDECIDED"  # nothing decided is not a pass
    named = compare(text, b, ["no_request_lost"])
    assert [s.name for s in named.specs] == ["no_request_lost"]
    rows = rows_by_name(named)
    assert rows[("verdicts", "no_request_lost")].a == "UNDECIDED"  # asked by name: decided
    assert not any(n.startswith("boot_health") for _, n in rows)


def test_a_log_with_a_lost_line_says_it_is_incomplete(tmp_path):
    cut = baseline()
    cut.r("iteration", running=0, waiting=0, lose=True)
    cut.stop()
    rows = rows_by_name(compare(baseline().write(tmp_path / "a.log"), cut.write(tmp_path / "b")))
    assert rows[("read", "complete")].b == "no (seq_gap)"


def test_a_change_is_what_shows():
    # below the shown precision (0.1 ms) two latencies are the same; above it they differ
    assert not Row("latency", "x", 0.10001, 0.10002, "s").changed
    assert Row("latency", "x", 0.1000, 0.1002, "s").delta() == "+0%"
    assert Row("latency", "x", 0.0, 0.002, "s").delta() == "+2.0 ms"  # no ratio from zero
    assert Row("latency", "x", 2.5, 1.25, "s").shown(2.5) == "2.500 s"
    assert Row("pool", "x", 0.5, None, "frac").delta() == "only in A"
    assert Row("read", "complete", "yes", "no (seq_gap)").delta() == "yes -> no (seq_gap)"


def test_json_and_table_carry_the_same_changes(tmp_path):
    d = compare(baseline().write(tmp_path / "a.log"), regressed().write(tmp_path / "b.log"))
    j = orjson.loads(to_json(d))
    assert j["changed"] == sum(r["changed"] for r in j["rows"]) == sum(r.changed for r in d.rows)
    assert j["a"]["verdict"] == "UNDECIDED" and j["b"]["verdict"] == "FAIL"
    assert j["a"]["logs"] == [str(tmp_path / "a.log")]
    console = Console(file=io.StringIO(), width=200)
    console.print(diff_table(d))
    out = console.file.getvalue()
    assert f"audit diff: {j['changed']} row(s) changed" in out
    assert "no_request_lost.every_request_ends" in out and "PASS -> FAIL" in out
    ready = rows_by_name(d)[("claims", "boot_health.ready")]
    assert (ready.a, ready.b) == ("PASS", "PASS")
    assert "boot_health.ready" not in out  # a claim that did not change is left out
