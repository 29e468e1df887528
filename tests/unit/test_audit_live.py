"""A live window (`audit verdict --live`): the log of a server still running is judged as a
window that ends at its last line. Claims about the end of the run are decided as of there; a
request in flight there stays UNDECIDED, never FAIL; a stop inside the window still counts; and
without the flag nothing changes (the report's JSON has no live keys at all)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import orjson

from audit.render import print_report, to_json
from audit.spec import resolve
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText
from tests.unit.test_audit_claims import decide

CASES = Path(__file__).resolve().parents[2] / "audit" / "acceptance"


def busy() -> LogText:
    """A server still running: two requests served, a third in flight where the copy ends."""
    log = LogText().ready().received("r-1").finish("r-1").received("r-2").finish("r-2")
    log.iter = 9
    return log.received("r-3").r("admission.admit", rid="r-3", tokens=5)


def claims(tmp_path: Path, window: str, log: LogText, live: bool) -> dict[str, tuple[str, str]]:
    report = evaluate([resolve(window)], [log.write(tmp_path / "boot.log")], live=live)
    return {c.claim: (c.status.value, c.reason) for c in report.specs[0].claims}


def test_a_live_window_decides_how_the_boot_ended_as_of_its_last_line(tmp_path):
    assert claims(tmp_path, "boot_health", busy(), live=False)["stopped_in_order"] == (
        "UNDECIDED",
        "in_flight_at_end",
    )
    got = claims(tmp_path, "boot_health", busy(), live=True)
    assert got.pop("no_store_set_aside") == ("N/A", "not_applicable")  # it opened no store
    assert got == {c: ("PASS", None) for c in got}


def test_a_request_in_flight_at_the_window_end_stays_undecided_never_fails(tmp_path):
    got = claims(tmp_path, "no_request_lost", busy(), live=True)
    assert got["every_request_ends"] == ("UNDECIDED", "in_flight_at_end")
    done = busy().finish("r-3")
    assert claims(tmp_path, "no_request_lost", done, live=True)["every_request_ends"] == (
        "PASS",
        None,
    )


def test_a_stop_inside_a_live_window_still_counts(tmp_path):
    crashed = busy().r("boot.stop", reason="scheduler_died", in_flight=1, exit_code=-9)
    got = claims(tmp_path, "boot_health", crashed, live=True)
    assert got["stopped_in_order"] == ("FAIL", None)
    lost = busy().stop()  # r-3 never ended and the boot stopped: lost, live or not
    assert claims(tmp_path, "no_request_lost", lost, live=True)["every_request_ends"][0] == "FAIL"


FINAL = (
    'kind = "final"\nselect = { kind = "iteration" }\ncheck = "waiting == 0"\n'
    'requires = { kind = "boot.ready" }\n'
)


def iteration(log: LogText, waiting: int) -> LogText:
    return log.r("iteration", running=1, waiting=waiting, parked=0, avail=100, evictable=0)


def test_a_last_value_is_final_as_of_the_window_end_and_one_that_fails_there_is_undecided(
    tmp_path,
):
    drained = iteration(iteration(LogText().ready(), 3), 0)
    assert decide(tmp_path, FINAL, drained).reason == "in_flight_at_end"  # without the flag
    v = decide_live(tmp_path, FINAL, drained)
    assert v.status == "PASS" and "live window" in v.why
    waiting = iteration(iteration(LogText().ready(), 0), 3)  # the line may drain after the copy
    v = decide_live(tmp_path, FINAL, waiting)
    assert (v.status, v.reason) == ("UNDECIDED", "in_flight_at_end"), v.why
    assert "waiting == 0" in v.why and "live window" in v.why
    stopped = iteration(LogText().ready(), 3).stop()  # a stop in the window: decided as ever
    assert decide_live(tmp_path, FINAL, stopped).status == "FAIL"


def decide_live(tmp_path: Path, claim: str, log: LogText):
    from audit.parse import parse_spec

    spec = parse_spec('description = "t"\n[[claim]]\nid = "c"\n' + claim, Path("t/spec.toml"))
    return evaluate([spec], [log.write(tmp_path / "boot.log")], live=True).specs[0].claims[0]


def test_a_text_log_cut_under_load_is_not_convicted_by_the_live_window(tmp_path):
    case = tomllib.loads((CASES / "sglang_pressure/cases/cut_without_shutdown.toml").read_text())
    log = tmp_path / "sglang.log"
    log.write_text(case["log"])
    report = evaluate([resolve("sglang_pressure")], [log], live=True)
    got = {c.claim: (c.status.value, c.reason) for c in report.specs[0].claims}
    assert got["queue_drained"] == ("UNDECIDED", "in_flight_at_end")  # 13 waiting at its end
    assert "FAIL" not in {v for v, _ in got.values()}
    end = report.as_dict()["window_end"]
    assert end["text_line"] == "sglang.log:5" and end["receipts"] == []


def test_the_report_says_where_the_live_window_ends(tmp_path):
    log = busy().write(tmp_path / "boot.log")
    d = orjson.loads(to_json(evaluate([resolve("boot_health")], [log], live=True)))
    assert d["live"] is True and d["verdict"] == "PASS"
    (end,) = d["window_end"]["receipts"]
    assert (end["boot"], end["rank"], end["seq"], end["iter"]) == ("b-00000001", 0, 8, 9)
    assert end["ts"] == orjson.loads(busy().lines[-1])["ts"]
    assert d["window_end"]["lines"] == 8 and d["window_end"]["text_line"] is None


def test_without_the_flag_the_report_has_no_live_keys(tmp_path):
    d = evaluate([resolve("boot_health")], [busy().write(tmp_path / "boot.log")]).as_dict()
    assert "live" not in d and "window_end" not in d


def test_the_text_report_heads_a_live_verdict_with_the_window_end(tmp_path):
    from rich.console import Console

    report = evaluate([resolve("boot_health")], [busy().write(tmp_path / "boot.log")], live=True)
    console = Console(record=True, width=200)
    print_report(report, console)
    text = console.export_text()
    head = text.splitlines()[0]
    assert head.startswith("live window:") and "seq 8" in head and "iter 9" in head


def test_a_live_log_read_again_is_read_only_as_far_as_the_first_time(tmp_path, monkeypatch):
    from audit import verdict

    log = LogText().ready().received("r-1").finish("r-1").received("r-2").finish("r-2")
    lines = str(log).splitlines(keepends=True)  # seq 1..6
    old, new = tmp_path / "1.log", tmp_path / "2.log"
    old.write_text("".join(lines[:3]))
    new.write_text("".join(lines[3:5]))  # r-2 received, not finished yet
    first = [new.stat().st_size, old.stat().st_size]
    calls, real = [], verdict.scan

    def growing(logs, **kw):  # the server writes r-2's finish while the window is read
        stats = real(logs, **kw)
        calls.append(kw.get("upto"))
        with new.open("a") as fh:
            fh.write(lines[5])
        return stats

    monkeypatch.setattr(verdict, "scan", growing)
    report = evaluate([resolve("no_request_lost")], [new, old], live=True)
    assert calls == [None, first]  # newest first: read again, in seq order, as far as before
    ends = [c for c in report.specs[0].claims if c.claim == "every_request_ends"][0]
    assert ends.status.value == "UNDECIDED" and ends.numbers["open_keys"] == ["r-2 (rank 0)"]
