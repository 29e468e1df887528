"""Text events in a spec: ``[event.NAME]`` needs a known log prefix (a regex that is not scoped by
one is a bad spec), its fields are checked like a receipt kind's, and every claim kind that reads
records can read its events: engaged, never, every (ended by a shutdown line), compare, invariant
and final (the last record of each key, once the run ended after it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.parse import SpecError, parse_spec
from audit.selftest import self_test
from audit.spec import acceptance_dir, load_spec
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText

EVENTS = r"""
[event.retraction]
prefix = "sglang"
regex = 'KV cache pool is full\. Retract requests\. #retracted_reqs: (?P<retracted>\d+), #new_token_ratio: (?P<before>\d+\.\d+) -> (?P<after>\d+\.\d+)'

[event.batch]
prefix = "sglang"
regex = 'Decode batch\. #running-req: (?P<running>\d+), .*#queue-req: (?P<queue>\d+)'

[event.shutdown]
prefix = "sglang"
regex = 'INFO: +Shutting down'
"""


def spec(claim: str, events: str = EVENTS):
    return parse_spec(
        f'description = "t"\n{events}\n[[claim]]\nid = "c"\n{claim}', Path("t/spec.toml")
    )


def decide(tmp_path: Path, claim: str, *lines: str):
    log = tmp_path / "sglang.log"
    log.write_text("".join(f"[2025-01-01 12:00:{i:02d} TP0] {x}\n" for i, x in enumerate(lines)))
    return evaluate([spec(claim)], [log]).specs[0].claims[0]


def retract(n: int, before: float = 0.3, after: float = 0.5) -> str:
    return f"KV cache pool is full. Retract requests. #retracted_reqs: {n}, #new_token_ratio: {before:.4f} -> {after:.4f}"


def batch(queue: int) -> str:
    return f"Decode batch. #running-req: 4, #token: 900, token usage: 0.5, #queue-req: {queue}"


SHUTDOWN = "INFO:     Shutting down"
ENGAGED = 'kind = "engaged"\nselect = { kind = "retraction" }\n'


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ("[event.retraction]\nregex = 'KV cache pool is full.*'\n", "needs 'prefix'"),
        ("[event.retraction]\nprefix = 'sglan'\nregex = 'x'\n", "got 'sglan'"),
        (
            "[event.retraction]\nprefix = 'sglang'\nlogger = 'scheduler.py'\nregex = 'x'\n",
            "sglang does not",
        ),
        ("[event.retraction]\nprefix = 'vllm'\nlogger = []\nregex = 'x'\n", "or a list of them"),
        (
            "[event.retraction]\nprefix = 'vllm'\nlogger = ['a.py', 3]\nregex = 'x'\n",
            "list of them",
        ),
        ("[event.retraction]\nprefix = 'sglang'\nregex = '(?P<seq>\\d+)'\n", "seq are taken"),
        ("[event.retraction]\nprefix = 'sglang'\nregex = '(?P<group>\\d+)'\n", "group are taken"),
        ("[event.retraction]\nprefix = 'sglang'\nregex = '(?P<proc>\\d+)'\n", "proc are taken"),
        ("[event.retraction]\nprefix = 'sglang'\nregex = '('\n", "bad regex"),
        (
            "[event.retraction]\nprefix = 'sglang'\nregex = 'x'\nsource = 'text'\n",
            "unknown key(s) source",
        ),
        ("[event.eviction]\nprefix = 'sglang'\nregex = 'x'\n", "'eviction' is a receipt kind"),
    ],
)
def test_a_text_event_without_a_known_prefix_is_a_bad_spec(events, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec(ENGAGED, events)


def test_a_logger_pin_may_name_several_loggers():
    events = "[event.retraction]\nprefix = 'vllm'\nlogger = ['metrics.py', 'llm_engine.py']\nregex = 'x'\n"
    [ev] = spec(ENGAGED, events).events
    assert ev.logger == ("metrics.py", "llm_engine.py")
    [ev] = spec(ENGAGED, events.replace("['metrics.py', 'llm_engine.py']", "'metrics.py'")).events
    assert ev.logger == ("metrics.py",)


def test_a_text_selector_with_named_groups_and_no_prefix_is_a_bad_spec():
    never = (
        'kind = "never"\nrequires = { kind = "batch" }\n'
        "select = { source = \"text\", regex = 'Retract requests\\. #retracted_reqs: (?P<n>\\d+)' }\n"
    )
    with pytest.raises(SpecError, match=r"named groups \(n\) make fields only in a text event"):
        spec(never)


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (
            'kind = "engaged"\nselect = { kind = "retraction", where = { acked = 1 } }\n',
            "has no field 'acked'",
        ),
        ('kind = "engaged"\nselect = { kind = "retractions" }\n', "nor a text event of this spec"),
        (
            'kind = "every"\nwhen = { kind = "retraction" }\nthen = { kind = "request.finish" }\nkey = "rid"\n',
            "text event 'retraction' has no field 'rid'",
        ),
        (
            'kind = "every"\nwhen = { kind = "retraction" }\nthen = { kind = "batch" }\nkey = "proc"\n'
            'stops = { kind = "boot.stop" }\n',
            "mixes receipts and text events",
        ),
        (
            'kind = "ranks_agree"\nselect = { kind = "batch" }\nfields = ["queue"]\n',
            "only receipts carry",
        ),
        ('kind = "final"\nselect = { kind = "batch" }\ncheck = "waiting == 0"\n', "names waiting"),
        (
            'kind = "final"\nselect = { kind = "batch" }\nkey = "rank_tag"\ncheck = "queue == 0"\n',
            "no field 'rank_tag'",
        ),
    ],
)
def test_event_fields_are_checked_like_a_receipt_kinds(claim, message):
    with pytest.raises(SpecError, match=message):
        spec(claim)


def test_min_ranks_zero_is_a_window_over_text_logs():
    regime = '[regime]\napplies = { kind = "batch" }\nmin_ranks = 0\n'
    assert spec(ENGAGED, EVENTS + regime).regime.min_ranks == 0
    with pytest.raises(SpecError, match="min_ranks is an integer >= 0"):
        spec(ENGAGED, EVENTS + regime.replace("= 0", "= -1"))


def test_engaged_and_never_read_text_events(tmp_path):
    assert decide(tmp_path, ENGAGED, batch(3)).reason == "no_engagement"
    v = decide(tmp_path, ENGAGED, batch(3), retract(2))
    assert v.status == "PASS" and "sglang.log:2" in v.why
    never = 'kind = "never"\nselect = { kind = "retraction", where = { retracted = { ">" = 4 } } }\nrequires = { kind = "batch" }\n'
    assert decide(tmp_path, never, batch(3), retract(2)).status == "PASS"
    assert decide(tmp_path, never, batch(3), retract(5)).status == "FAIL"


RESOLVED = (
    'kind = "every"\nwhen = { kind = "retraction" }\nthen = { kind = "batch", where = { queue = 0 } }\n'
    'key = "proc"\nstops = { kind = "shutdown" }\n'
)


def test_every_over_text_events_is_ended_by_the_shutdown_line(tmp_path):
    v = decide(tmp_path, RESOLVED, retract(1), batch(0), retract(2), batch(3))
    assert (v.status, v.reason) == ("UNDECIDED", "in_flight_at_end"), v.why  # no shutdown yet
    v = decide(tmp_path, RESOLVED, retract(1), batch(0), retract(2), batch(3), SHUTDOWN)
    assert v.status == "FAIL", v.why
    assert (
        "proc 'TP0': retraction at sglang.log:3, the run ended later" in v.why
    )  # the last retract
    v = decide(tmp_path, RESOLVED, retract(1), batch(0), retract(2), batch(0))
    assert v.status == "PASS", v.why  # resolved needs no shutdown


def test_compare_and_invariant_over_event_fields(tmp_path):
    compare = (
        'kind = "compare"\ncount = { retractions = { kind = "retraction" } }\n'
        'sum = { retracted = { select = { kind = "retraction" }, field = "retracted" } }\n'
        'check = "retracted <= 2 * retractions"\n'
    )
    v = decide(tmp_path, compare, retract(1), retract(3))
    assert v.status == "PASS" and v.numbers == {"retractions": 2, "retracted": 4}, v.why
    assert decide(tmp_path, compare, retract(1), retract(5)).status == "FAIL"
    rises = 'kind = "invariant"\nselect = { kind = "retraction" }\ncheck = "after >= before"\n'
    assert decide(tmp_path, rises, retract(1, 0.3, 0.5)).status == "PASS"
    v = decide(tmp_path, rises, retract(1, 0.3, 0.5), retract(1, 0.9, 0.5))
    assert v.status == "FAIL" and "retraction line at sglang.log:2" in v.why, v.why


DRAINED = (
    'kind = "final"\nselect = { kind = "batch" }\nkey = "proc"\ncheck = "queue == 0"\n'
    'stops = { kind = "shutdown" }\n'
)


def test_final_reads_the_last_record_once_the_run_ended(tmp_path):
    assert decide(tmp_path, DRAINED, SHUTDOWN).reason == "no_engagement"
    v = decide(tmp_path, DRAINED, batch(5), batch(0))
    assert (v.status, v.reason) == ("UNDECIDED", "in_flight_at_end"), v.why
    assert decide(tmp_path, DRAINED, batch(5), batch(0), SHUTDOWN).status == "PASS"
    v = decide(tmp_path, DRAINED, batch(0), batch(5), SHUTDOWN)
    assert v.status == "FAIL" and "proc 'TP0': batch line at sglang.log:2: 5 == 0" in v.why, v.why


def test_final_over_receipts_ends_at_boot_stop(tmp_path):
    claim = 'kind = "final"\nselect = { kind = "iteration" }\ncheck = "waiting == 0"\n'
    parsed = parse_spec(f'description = "t"\n[[claim]]\nid = "c"\n{claim}', Path("t/spec.toml"))

    def verdict(log: LogText):
        return evaluate([parsed], [log.write(tmp_path / "boot.log")]).specs[0].claims[0]

    def iteration(log: LogText, waiting: int, rank: int = 0) -> LogText:
        return log.r("iteration", rank, running=1, waiting=waiting)

    log = iteration(iteration(LogText().ready(), 4), 0)
    assert verdict(log).reason == "in_flight_at_end"
    assert verdict(log.stop()).status == "PASS"
    log = iteration(iteration(LogText().ready(), 0), 3).stop()
    v = verdict(log)
    assert v.status == "FAIL" and "iteration (boot b-00000001 rank 0 seq 4" in v.why, v.why


@pytest.mark.parametrize("window", ["sglang_pressure", "vllm_pressure"])
def test_the_foreign_windows_agree_with_their_cases_decoys_included(window):
    result = self_test(load_spec(acceptance_dir() / window))
    assert [f"{c.name}: {p}" for c in result.cases for p in c.problems] + result.coverage == []
    got = {c.name: c.got for c in result.cases}
    assert "decoys" in got and "FAIL" not in got["decoys"].values()
    spec = load_spec(acceptance_dir() / window)
    assert spec.regime.min_ranks == 0 and all(
        e.format in ("sglang", "vllm", "uvicorn") for e in spec.events
    )
