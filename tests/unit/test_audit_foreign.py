"""Foreign engines' text lines as events: a line becomes an event only if it starts with the named
engine's log head and the event's regex matches the whole rest; the named groups are its fields,
numbers read as numbers. A line with the same words and any other start is not an event (but
for the outer layers a collector writes before the head: test_audit_foreign_layers.py)."""

from __future__ import annotations

import re

from audit.checker import Bus
from audit.foreign import FORMATS, TEXT_BOOT, Matcher, number
from audit.model import ReceiptSel, TextEvent

RETRACT = (
    r"KV cache pool is full\. Retract requests\. #retracted_reqs: (?P<retracted>\d+)"
    r"(?:, #new_tokens_gained: (?P<gained>\d+))?"
    r"(?:, #new_token_ratio: (?P<before>\d+\.\d+) -> (?P<after>\d+\.\d+))?"
)
STATS = r"Avg prompt throughput: .* Running: (?P<running>\d+) reqs, .*Pending: (?P<waiting>\d+) reqs, .*"


def event(name: str, fmt: str, regex: str, logger: str | None = None) -> TextEvent:
    pattern = re.compile(regex)
    pins = None if logger is None else (logger,)
    return TextEvent(name, fmt, pattern, pins, FORMATS[fmt].fields | set(pattern.groupindex))


SG_RETRACT = event("retract", "sglang", RETRACT)
V_STATS = event("stats", "vllm", STATS, logger="metrics.py")
SG_LINE = "[2025-01-01 12:00:13 DP1 TP1] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.3150 -> 0.5000"
V_LINE = "INFO 01-22 18:27:15 metrics.py:449] Avg prompt throughput: 812.3 tokens/s, Avg generation throughput: 41.7 tokens/s, Running: 16 reqs, Swapped: 0 reqs, Pending: 48 reqs, GPU KV cache usage: 99.2%, CPU KV cache usage: 0.0%."


def found(events: list[TextEvent], line: str) -> list[tuple[str, dict]]:
    return [(ev.name, fields) for ev, fields in Matcher(events).read(line)[1]]


def test_named_groups_become_fields_with_numbers_read_as_numbers():
    [(name, fields)] = found([SG_RETRACT], SG_LINE)
    assert name == "retract"
    assert fields == {
        "time": "2025-01-01 12:00:13",
        "proc": "DP1 TP1",  # the head's groups: the rank tag
        "group": "DP1",  # and the scheduler group it belongs to
        "retracted": 3,
        "before": 0.315,
        "after": 0.5,  # an optional group that did not match ('gained') is left out
    }
    assert type(fields["retracted"]) is int and type(fields["after"]) is float


def test_a_head_part_the_line_lacks_is_an_empty_field():
    # one rank: SGLang writes no rank tag; a 2024 release wrote the time alone
    [(_, fields)] = found(
        [SG_RETRACT], "[12:00:13] KV cache pool is full. Retract requests. #retracted_reqs: 1"
    )
    assert fields == {"time": "12:00:13", "proc": "", "group": "", "retracted": 1}


def test_the_group_is_the_rank_tag_without_the_ranks_its_first_rank_speaks_for():
    # every TP (and EP) rank logs a retraction; only a DP/PP group's first rank reports batches
    line = SG_LINE.replace("DP1 TP1", "{}")
    got = {
        tag: found([SG_RETRACT], line.format(tag))[0][1]["group"]
        for tag in ("TP0", "TP5", "DP1 TP3", "DP0 PP1 TP3 EP3", "PP1 TP12")
    }
    assert got == {
        "TP0": "",
        "TP5": "",
        "DP1 TP3": "DP1",
        "DP0 PP1 TP3 EP3": "DP0 PP1",
        "PP1 TP12": "PP1",
    }


def test_vllm_heads_old_and_new_and_the_process_tag():
    [(_, old)] = found([V_STATS], V_LINE)
    assert old["level"] == "INFO" and old["logger"] == "metrics.py" and old["proc"] == ""
    assert (old["running"], old["waiting"]) == (16, 48)
    new = "(APIServer pid=851) WARNING 04-28 22:54:32 [metrics.py:486] " + V_LINE.split("] ", 1)[1]
    [(_, fields)] = found([V_STATS], new)
    assert (fields["proc"], fields["level"], fields["waiting"]) == (
        "APIServer pid=851",
        "WARNING",
        48,
    )


def test_the_logger_is_part_of_the_scope():
    other = V_LINE.replace("metrics.py:449]", "mybench.py:12]")
    assert found([V_STATS], other) == []
    unpinned = event("stats", "vllm", STATS)
    assert [n for n, _ in found([unpinned], other)] == ["stats"]


def test_the_words_without_the_head_are_not_an_event():
    message = SG_LINE.split("] ", 1)[1]
    for line in (
        message,  # echoed bare
        "2025-01-01 12:00:12,004 INFO tail: " + message,  # another program's head
        "[2025-01-01 12:00:11 TP0] Receive: obj=GenerateReqInput(text='" + message + "')",
        "[2025-01-01 12:00:11 TP0] " + message + " (quoted)",  # the rest must match whole
        " " + SG_LINE,  # the head must start the line
    ):
        assert found([SG_RETRACT], line) == [], line


def test_numbers():
    assert [number(s) for s in ("000", "-3", "0.5000", "1e3", ".5")] == [0, -3, 0.5, 1000.0, 0.5]
    assert [number(s) for s in ("cmpl-1", "1.2.3", "", "TP0")] == ["cmpl-1", "1.2.3", "", "TP0"]


def test_the_bus_makes_events_in_line_order_for_subscribers_only():
    bus, got = Bus(), []
    bus.subscribe(ReceiptSel("retract", event=SG_RETRACT), got.append)
    bus.text("text", "plain noise", "a.log:1")
    bus.text("text", "\x1b[1;36m" + SG_LINE + "\x1b[0m", "a.log:2")  # colour codes dropped
    bus.text("json", SG_LINE, "a.log:3")  # a foreign JSON line is never a text event
    bus.text("text", SG_LINE, "b.log:1")
    assert [(r["seq"], r["where"]) for r in got] == [(2, "a.log:2"), (4, "b.log:1")]
    assert got[0]["event"] == "retract" and got[0]["boot"] == TEXT_BOOT
    assert got[0]["retracted"] == 3
    assert bus.kinds == {}  # a text event is never routed as a receipt kind
