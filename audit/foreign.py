"""Foreign engines' plain-text log lines, read as events with fields.

A logged line has two parts: the *head* the engine's logging setup writes before every message
(time, rank or process tag, level, logger) and the message. A spec's text event (``[event.NAME]``
in ``spec.toml``) names one of the head formats below and a regex over the message, and a line
becomes that event only if it starts with the head *and* the regex matches the whole rest of it.
A user's prompt echoed into the log, or another library's line carrying the same words, starts
otherwise and never becomes an event: the false-PASS lesson, kept by construction. The heads are
written here, one format per engine (a few shapes each, one per logging setup it is run with),
each from what that engine's logging setup writes; a spec can only name one, so no spec can
scope a regex with a head that matches anything.

Before the engine's head, a log as operators collect it may carry *outer layers* others wrote:
a collector's prefix (``docker logs -t``'s time, journald's ``host unit[pid]:``, docker
compose's ``service  | ``, ``srun --label``'s task number; a CI job log's time, GitLab's with
its stream, Kubernetes' container log file's time and stream, logcli's time and labels), a
launcher's process tag (Ray's
``(SGLangEngine pid=41820)``), or a progress bar the line was written after (what follows a
carriage return is what a console shows). ``LAYERS`` is their one table. They are stripped
only where the line does not already start with a head (the common case costs nothing more),
one at a time, the heads tried again after each: a line is an event only where, once outer
layers are gone, an engine's own head starts it. A layer is never a head: a prompt behind a
compose prefix is still a prompt. The line without its outer layers is also what a spec's
whole-line text selectors match.

The event's fields are the head's named groups (always there; empty where the line lacks that
part, e.g. the rank tag of a single-rank SGLang) and the regex's (left out where an optional group
did not match), with integers and decimals read as numbers. A head whose rank tag names ranks
that log alike also gives ``group``: the tag without the ranks one rank speaks for (SGLang's
tensor-parallel ranks all log their retractions, only the group's first logs batch reports, so
'DP1 TP3' is of group 'DP1', 'TP5' of the one group ''): a claim about a group keys by it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from audit.model import TextEvent

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # colour codes a console log may carry
TEXT_BOOT = "text"  # the ``boot`` of every text event: the records of one stream, in line order
# fields every text event carries besides its own; a spec's regex may not name these
RESERVED = frozenset({"event", "boot", "rank", "seq", "iter", "ts", "v", "where"})

# vLLM's per-process tag on each line a worker or engine process writes: "(EngineCore_DP0 pid=7) "
_PROC = r"(?:\((?P<proc>[^()\n]*(?:\([^()\n]*\)[^()\n]*)*)\) )?"
_LEVEL = r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)"
_ANY_LEVEL = r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)"
_DATETIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?"  # Python logging's asctime
_RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)"
_SYSLOG_TIME = r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d"  # "Sep 22 23:46:42", "Sep  2 03:04:05"


@dataclass(slots=True, frozen=True)
class Layer:
    """One kind of outer layer: ``pattern`` matched where a line does not start with a head."""

    name: str
    pattern: str
    learned: str  # where the shape comes from


LAYERS = (
    # the three below start as "timestamps" (and journald's short-iso) do, so they come before
    # them: the first that matches is stripped
    Layer(
        "gitlab",
        # "2024-05-30T14:30:00.123456Z 00O  ", "2024-05-30T14:30:00.123456Z 01E+ "
        _RFC3339 + r" [0-9a-f]{2}[OE][+ ] ",
        "GitLab CI's job log timestamps (FF_TIMESTAMPS): the time, the stream's two hex digits, "
        "'O' stdout or 'E' stderr, ' ' a new line or '+' a continued one",
    ),
    Layer(
        "cri",
        # "2025-01-22T18:27:15.731100201Z stdout F "
        _RFC3339 + r" (?:stdout|stderr) [FP] ",
        "Kubernetes' container log files (CRI: what Fluent Bit, Promtail and the kubelet read): "
        "the time, the stream, 'F' a full line or 'P' a part of one",
    ),
    Layer(
        "logcli",
        # '2025-01-22T18:27:15Z {container="vllm", pod="vllm-0"}  '
        _RFC3339 + r' \{(?:[\w.]+="(?:[^"\\\n]|\\.)*"(?:, )?)*\} +',
        "Loki's logcli query output: the entry's time, the labels not common to every line "
        "(padded to one width)",
    ),
    Layer(
        "journald",
        # "Sep 22 23:46:42 gpu-3 vllm[361991]: ", "2025-09-22T23:46:42+0000 gpu-3 vllm[361991]: "
        f"(?:{_SYSLOG_TIME}|{_RFC3339})" + r" [^\s\[\]]+ [^\s\[\]:]+(?:\[\d+\])?: ",
        "journalctl's short and short-iso output: time, host, identifier[pid]",
    ),
    Layer(
        "timestamps",
        _RFC3339 + " ",  # "2025-10-15T00:07:38.764529167Z ", "2024-05-01T12:34:56.1234567Z "
        "docker logs -t, kubectl logs --timestamps, GitHub Actions' job logs: the time each "
        "line was read, RFC 3339",
    ),
    Layer(
        "buildkite",
        r"\[" + _RFC3339 + r"\] ",  # "[2025-03-10T15:07:20Z] "
        "Buildkite's job log with timestamps: the time in square brackets",
    ),
    Layer(
        "compose",
        r"[\w.-]+ +\| ",  # "vllm-1  | ", "sglang_1     | "
        "docker compose logs: the service (and replica) name, padded, then '| '",
    ),
    Layer(
        "actor",
        # "(SGLangEngine pid=41820) ", "(RayWorkerWrapper pid=2211, ip=10.0.0.2) ", "(task, pid=7) "
        r"\((?:[\w.:-]+,? )?pid=\d+(?:, ip=[0-9a-fA-F.:]+)?\) ",
        "Ray's tag on its actors' and tasks' output (SkyPilot's on its task's)",
    ),
    Layer("label", r"\d+: ", "srun --label: the task number"),
    Layer(
        "progress",
        # "Processed prompts:  50%|█████     | 32/64 [00:10<00:10, 3.20it/s, est. speed ...]"
        r"(?:[^\r\n|]{0,200}?: )? *\d{1,3}%\|[^|\r\n]*\| *[\d.]+[kMGT]?/[\d.]+[kMGT]? \[[^\]\r\n]*\]",
        "tqdm's bar (vLLM's and SGLang's offline runs), a line written after it with no newline",
    ),
)
OUTER = re.compile("|".join(f"(?:{layer.pattern})" for layer in LAYERS))


@dataclass(slots=True, frozen=True)
class LogFormat:
    """One engine's line head, in the shapes its logging setups write: ``heads`` tried in turn
    at the start of a line (the usual one first); ``logger``: whether it names the logger (a
    ``logger`` group a text event may pin)."""

    name: str
    heads: tuple[re.Pattern[str], ...]
    logger: bool
    learned: str  # where the shapes come from
    # the parts of the rank tag (``proc``) dropped to name its ``group``; None: no group field
    peers: re.Pattern[str] | None = None
    names: tuple[str, ...] = field(init=False)  # every head's groups (and ``group``), sorted

    def __post_init__(self) -> None:
        named = {g for head in self.heads for g in head.groupindex}
        object.__setattr__(
            self, "names", tuple(sorted(named | ({"group"} if self.peers else set())))
        )

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(self.names)


FORMATS: dict[str, LogFormat] = {
    f.name: f
    for f in (
        LogFormat(
            "sglang",
            (
                # "[2025-01-01 12:00:00 TP0] ", "[2025-01-01 12:00:00 DP1 TP1] ", "[2025-01-01
                # 12:00:00] " (one rank, or the HTTP server), "[12:00:00 TP0] " (2024 releases),
                # "[2025-01-01 12:00:00.123 TP0] " (SGLANG_LOG_MS)
                re.compile(
                    r"\[(?P<time>(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:\.\d+)?)"
                    r"(?: (?P<proc>[A-Z][A-Z_]*\d+(?: [A-Z][A-Z_]*\d+)*))?\] "
                ),
                # with a logging config (SGLANG_LOGGING_CONFIG_PATH), no rank tag: "2025-12-04
                # 20:35:53 INFO 151972 [scheduler_metrics_mixin.py:287] ", "2026-06-07
                # 10:59:31,659 [INFO] sglang.srt.managers.scheduler_metrics_mixin: "
                re.compile(rf"(?P<time>{_DATETIME}) {_ANY_LEVEL} \d+ \[[\w.-]+\.py:\d+\] "),
                re.compile(rf"(?P<time>{_DATETIME}) \[{_ANY_LEVEL}\] sglang(?:\.\w+)*: "),
            ),
            logger=False,
            learned="SGLang's configure_logger ('[%(asctime)s{prefix}] %(message)s', the prefix "
            "the scheduler's DP/PP/TP/EP ranks), the heads of logs run with a logging config, "
            "and its scheduler lines quoted in its issues",
            # every TP (and EP) rank of a DP/PP group logs a retraction; only its rank 0 the batch
            peers=re.compile(r" ?\b(?:TP|EP)\d+\b"),
        ),
        LogFormat(
            "vllm",
            (
                # "INFO 01-22 18:27:20 metrics.py:449] " (to 0.7), "(APIServer pid=851) INFO
                # 04-28 22:54:32 [loggers.py:257] " (0.8 on, with the process tag of a
                # multi-process run)
                re.compile(
                    _PROC + _LEVEL + r" (?P<time>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? "
                    r"\[?(?P<logger>[\w.-]+):\d+\] "
                ),
                # a logging config's (VLLM_LOGGING_CONFIG_PATH) usual format, the logger a
                # module of vllm's: "2025-03-01 10:00:00,123 - vllm.engine.metrics - INFO - "
                re.compile(
                    _PROC + rf"(?P<time>{_DATETIME}) - (?P<logger>vllm(?:\.\w+)*) - {_LEVEL} - "
                ),
            ),
            logger=True,
            learned="vLLM's logger format ('%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] "
            "%(message)s', without the brackets before 0.8), its per-process line prefix, and "
            "Python logging's '%(asctime)s - %(name)s - %(levelname)s - %(message)s'",
        ),
        LogFormat(
            "uvicorn",
            # "INFO:     Shutting down", "(APIServer pid=851) INFO:     Shutting down"
            (re.compile(_PROC + _LEVEL + r": +"),),
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


def module(logger: str) -> str:
    """The module a logger names: its file without '.py' ('metrics.py'), or the last part of a
    dotted logger name ('vllm.engine.metrics'); a pinned logger is compared by it."""
    return logger[:-3] if logger.endswith(".py") else logger.rpartition(".")[2]


Found = list[tuple[TextEvent, dict[str, Any]]]


class Matcher:
    """The events of some text-event definitions, found in lines: at the start of a line (and
    after each outer layer, where none starts it) each format's heads are tried, then the
    patterns of that format's events over the rest."""

    def __init__(self, events: Iterable[TextEvent]) -> None:
        by_format: dict[str, list[TextEvent]] = {}
        for ev in events:
            by_format.setdefault(ev.format, []).append(ev)
        self.heads: list[tuple[re.Pattern[str], LogFormat, dict[str, str], list[Any]]] = []
        for name, evs in by_format.items():
            fmt = FORMATS[name]
            pins = [(e, None if e.logger is None else {module(x) for x in e.logger}) for e in evs]
            for head in fmt.heads:  # with the fields this head lacks, left empty
                lacks = set(fmt.names) - set(head.groupindex) - {"group"}
                self.heads.append((head, fmt, dict.fromkeys(sorted(lacks), ""), pins))
        self._groups: dict[str, str] = {}  # rank tag -> its group, worked out once a tag

    def read(self, line: str) -> tuple[str, Found]:
        """The line as its engine wrote it (outer layers stripped; whole where a head starts
        it), and the events it makes."""
        found = self._at(line, 0)
        if found is not None:
            return line, found
        pos = line.rfind("\r") + 1  # a console shows what follows the last carriage return
        while True:
            if pos:
                found = self._at(line, pos)
                if found is not None:
                    return line[pos:], found
            layer = OUTER.match(line, pos)
            if layer is None:
                return line[pos:], []
            pos = layer.end()

    def _at(self, line: str, pos: int) -> Found | None:
        """The events of the line whose head starts at ``pos``; None: no head starts there."""
        for head, fmt, lacks, pins in self.heads:
            h = head.match(line, pos)
            if h is None:
                continue
            rest, named = line[h.end() :], module(h["logger"]) if fmt.logger else None
            out = []
            for ev, loggers in pins:
                if loggers is not None and named not in loggers:
                    continue
                m = ev.pattern.fullmatch(rest)
                if m is not None:
                    out.append((ev, self._fields(fmt, lacks, h, m)))
            return out
        return None

    def _fields(
        self, fmt: LogFormat, lacks: dict[str, str], head: re.Match[str], body: re.Match[str]
    ) -> dict[str, Any]:
        """An event's fields: the head's groups (empty where absent, or where this head lacks
        them) and the rank group, then the body's (left out where an optional group did not
        match)."""
        named = head.groupdict()
        out: dict[str, Any] = {k: number(v) if v else "" for k, v in named.items()}
        if lacks:
            out.update(lacks)
        if fmt.peers is not None:
            tag = named.get("proc") or ""
            group = self._groups.get(tag)
            if group is None:
                group = self._groups[tag] = fmt.peers.sub("", tag).strip()
            out["group"] = group
        out.update({k: number(v) for k, v in body.groupdict().items() if v is not None})
        return out


def plain(line: str) -> str:
    """A line as a console shows it: colour codes dropped."""
    return ANSI.sub("", line) if "\x1b" in line else line
