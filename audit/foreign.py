"""Foreign engines' plain-text log lines, read as events with fields.

A logged line has two parts: the *head* the engine's logging setup writes before every message
(time, rank or process tag, level, logger) and the message. A spec's text event (``[event.NAME]``
in ``spec.toml``) names one of the head formats below and a regex over the message, and a line
becomes that event only if it starts with the head *and* the regex matches the whole rest of it.
A user's prompt echoed into the log, or another library's line carrying the same words, starts
otherwise and never becomes an event: the false-PASS lesson, kept by construction. The heads are
written here, one per engine, each from what that engine's logging setup writes; a spec can only
name one, so no spec can scope a regex with a head that matches anything.

The event's fields are the head's named groups (always there; empty where the line lacks that
part, e.g. the rank tag of a single-rank SGLang) and the regex's (left out where an optional group
did not match), with integers and decimals read as numbers. A head whose rank tag names ranks
that log alike also gives ``group``: the tag without the ranks one rank speaks for (SGLang's
tensor-parallel ranks all log their retractions, only the group's first logs batch reports, so
'DP1 TP3' is of group 'DP1', 'TP5' of the one group ''): a claim about a group keys by it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from audit.model import TextEvent

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # colour codes a console log may carry
TEXT_BOOT = "text"  # the ``boot`` of every text event: the records of one stream, in line order
# fields every text event carries besides its own; a spec's regex may not name these
RESERVED = frozenset({"event", "boot", "rank", "seq", "iter", "ts", "v", "where"})

# vLLM's per-process tag on each line a worker or engine process writes: "(EngineCore_DP0 pid=7) "
_PROC = r"(?:\((?P<proc>[^()\n]*(?:\([^()\n]*\)[^()\n]*)*)\) )?"
_LEVEL = r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)"


@dataclass(slots=True, frozen=True)
class LogFormat:
    """One engine's line head: ``head`` matched at the start of a line; ``logger``: whether it
    names the logger (a ``logger`` group a text event may pin)."""

    name: str
    head: re.Pattern[str]
    logger: bool
    learned: str  # where the shape comes from
    # the parts of the rank tag (``proc``) dropped to name its ``group``; None: no group field
    peers: re.Pattern[str] | None = None

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(self.head.groupindex) | ({"group"} if self.peers else set())


FORMATS: dict[str, LogFormat] = {
    f.name: f
    for f in (
        LogFormat(
            "sglang",
            # "[2025-01-01 12:00:00 TP0] ", "[2025-01-01 12:00:00 DP1 TP1] ", "[2025-01-01
            # 12:00:00] " (one rank, or the HTTP server), "[12:00:00 TP0] " (2024 releases)
            re.compile(
                r"\[(?P<time>(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d)"
                r"(?: (?P<proc>[A-Z][A-Z_]*\d+(?: [A-Z][A-Z_]*\d+)*))?\] "
            ),
            logger=False,
            learned="SGLang's configure_logger ('[%(asctime)s{prefix}] %(message)s', the prefix "
            "the scheduler's DP/PP/TP/EP ranks) and its scheduler lines quoted in its issues",
            # every TP (and EP) rank of a DP/PP group logs a retraction; only its rank 0 the batch
            peers=re.compile(r" ?\b(?:TP|EP)\d+\b"),
        ),
        LogFormat(
            "vllm",
            # "INFO 01-22 18:27:20 metrics.py:449] " (to 0.7), "(APIServer pid=851) INFO 04-28
            # 22:54:32 [loggers.py:257] " (0.8 on, with the process tag of a multi-process run)
            re.compile(
                _PROC + _LEVEL + r" (?P<time>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? "
                r"\[?(?P<logger>[\w.-]+):\d+\] "
            ),
            logger=True,
            learned="vLLM's logger format ('%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] "
            "%(message)s', without the brackets before 0.8) and its per-process line prefix",
        ),
        LogFormat(
            "uvicorn",
            # "INFO:     Shutting down", "(APIServer pid=851) INFO:     Shutting down"
            re.compile(_PROC + _LEVEL + r": +"),
            logger=False,
            learned="uvicorn's default format ('%(levelprefix)s %(message)s'), as vLLM's HTTP "
            "server writes it",
        ),
    )
}

_INT = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?\d+[eE][+-]?\d+")


def number(text: str) -> int | float | str:
    """A field's value: an integer or a decimal as a number, anything else as it was written."""
    if _INT.fullmatch(text):
        return int(text)
    if _DECIMAL.fullmatch(text):
        return float(text)
    return text


def fields(fmt: LogFormat, head: re.Match[str], body: re.Match[str]) -> dict[str, Any]:
    """An event's fields: the head's groups (empty where absent) and the rank group it derives,
    then the body's (left out where an optional group did not match)."""
    out: dict[str, Any] = {k: number(v) if v else "" for k, v in head.groupdict().items()}
    if fmt.peers is not None:
        out["group"] = fmt.peers.sub("", head["proc"] or "").strip()
    out.update({k: number(v) for k, v in body.groupdict().items() if v is not None})
    return out


class Matcher:
    """The events of some text-event definitions, found in lines: each format's head is matched
    once a line, then the patterns of that format's events over the rest."""

    def __init__(self, events: Iterable[TextEvent]) -> None:
        by_format: dict[str, list[TextEvent]] = {}
        for ev in events:
            by_format.setdefault(ev.format, []).append(ev)
        self.groups = [(FORMATS[f], evs) for f, evs in by_format.items()]

    def match(self, line: str) -> Iterator[tuple[TextEvent, dict[str, Any]]]:
        for fmt, evs in self.groups:
            h = fmt.head.match(line)
            if h is None:
                continue
            rest = line[h.end() :]
            for ev in evs:
                m = ev.pattern.fullmatch(rest)
                if m is not None and (ev.logger is None or h["logger"] == ev.logger):
                    yield ev, fields(fmt, h, m)


def plain(line: str) -> str:
    """A line as a console shows it: colour codes dropped."""
    return ANSI.sub("", line) if "\x1b" in line else line
