"""Receipt emitters: one JSON line per decision, written through structlog with orjson.

``Receipts.emit`` never raises into its caller: a failing sink is reported once on stderr and
counted, and the engine goes on. Every receipt carries the common fields of the schema. What was
decided (``counts``), what was written (``written``) and what could not be (``failed``, a full
disk say) are counted apart, by kind; the kinds of ``schema.TALLIES`` also by what they said
(``tallies``: a relief rung by its outcome, say).
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson
import structlog

from engine.observability import schema

CAPTURE_LIMIT = 200_000


def new_boot_id() -> str:
    return "b-" + uuid.uuid4().hex[:8]


class _LineWriter:
    """A structlog logger that writes rendered bytes as one line each, whole or not at all as
    far as the sink lets it: a file is written unbuffered, so a line that failed (ENOSPC) is
    not held in a buffer to reach the log later, and one cut by a full disk is ended before
    the next line is written."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self._cut = False  # a line was written in part

    def msg(self, message: bytes) -> None:
        line = b"\n" + message + b"\n" if self._cut else message + b"\n"
        n = self._fh.write(line)
        if n != len(line):
            self._rest(memoryview(line), n)
        self._cut = False  # all of it is down (a write that failed raised)
        self._fh.flush()

    def _rest(self, line: memoryview, n: int) -> None:
        """A raw write took part of the line: the rest, until it is all down or a write fails."""
        while True:
            if n:
                self._cut = line[n - 1] != ord("\n")
            line = line[n:]
            if not line:
                return
            n = self._fh.write(line)

    info = msg


def _orjson_serializer(obj: Any, **_: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, default=str)


class Receipts:
    """An emitter bound to one boot and one rank.

    Sinks: a boot-log file (``path``), an open binary stream (``stream``), an in-memory list
    (``capture=True``, for tests and diagnostics), and a human console renderer (``console``).
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        stream: IO[bytes] | None = None,
        capture: bool | int = False,
        console: bool = False,
        boot: str | None = None,
        rank: int = 0,
        enabled: bool = True,
        after: tuple[int, int] = (0, 0),
    ) -> None:
        """``after``: the (seq, iter) of the last receipt of a log this one continues."""
        self.boot = boot or new_boot_id()
        self.rank = rank
        self.seq, self.iter = after
        self.enabled = enabled  # False: nothing is written (the receipts-off benchmark arm)
        # capture keeps the newest receipts in memory: True keeps CAPTURE_LIMIT, an int that many
        limit = CAPTURE_LIMIT if capture is True else int(capture)
        self.records: deque[dict[str, Any]] | None = deque(maxlen=limit) if capture else None
        self.failures = 0
        self.counts: Counter[str] = Counter()  # receipts emitted per kind since boot: decisions
        self.written: Counter[str] = Counter()  # of them, those every sink took
        self.failed: Counter[str] = Counter()  # of them, those that could not be written
        # the kinds of schema.TALLIES, by (kind, what they said): a rung that raised, say
        self.tallies: Counter[tuple[str, str]] = Counter()
        self._once: set[str] = set()
        self._lock = threading.Lock()
        # tracing's hook (``RequestTraces.on_receipt``): sees every receipt, written or not
        self.tap: Callable[[str, dict[str, Any]], None] | None = None
        self._file: IO[bytes] | None = None
        self._loggers: list[Any] = []
        if path is not None:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            self._file = p.open("ab", buffering=0)
            self.path: Path | None = p
        else:
            self.path = None
        for fh in (self._file, stream):
            if fh is not None:
                self._loggers.append(
                    structlog.wrap_logger(
                        _LineWriter(fh),
                        processors=[
                            structlog.processors.JSONRenderer(serializer=_orjson_serializer)
                        ],
                    )
                )
        if console:
            self._loggers.append(
                structlog.wrap_logger(
                    structlog.PrintLogger(sys.stderr),
                    processors=[structlog.dev.ConsoleRenderer(colors=False)],
                )
            )

    def emit(self, event: str, **fields: Any) -> None:
        """Write one receipt. Never raises. A receipt that fails still consumed its ``seq``, so
        the log shows the loss as a gap. Every kind is counted in ``counts``, and in ``written``
        or ``failed`` (none of them with receipts off)."""
        self.counts[event] += 1
        if (said := schema.tally_of(event, fields)) is not None:
            self.tallies[event, said] += 1
        if self.tap is not None:
            self._tap(event, fields)
        if not self.enabled:
            return
        try:
            with self._lock:
                self.seq += 1
                record = {
                    "ts": round(time.time(), 6),
                    "v": schema.SCHEMA_VERSION,
                    "boot": self.boot,
                    "rank": self.rank,
                    "iter": self.iter,
                    "seq": self.seq,
                    **fields,
                }
                if event not in schema.CATALOG:
                    raise KeyError(f"receipt kind {event!r} is not in the schema")
                if self.records is not None:
                    self.records.append({"event": event, **record})
                for log in self._loggers:
                    log.info(event, **record)
                self.written[event] += 1
        except Exception as e:  # an emitter must never take down what it observes
            self.failed[event] += 1
            self.failures += 1
            if self.failures == 1:
                print(
                    f"attest: receipt emitter failed ({type(e).__name__}: {e}); "
                    "further failures are counted, not printed",
                    file=sys.stderr,
                )

    def _tap(self, event: str, fields: dict[str, Any]) -> None:
        try:
            self.tap(event, {"iter": self.iter, **fields})
        except Exception as e:  # the hook guards itself; this is the last net
            self.failures += 1
            if self.failures == 1:
                print(f"attest: receipt hook failed ({type(e).__name__}: {e})", file=sys.stderr)

    def once(self, key: str, event: str, **fields: Any) -> bool:
        """Emit only the first time ``key`` is seen; returns whether it emitted."""
        if key in self._once:
            return False
        self._once.add(key)
        self.emit(event, **fields)
        return True

    def next_iteration(self) -> int:
        """A scheduler iteration begins: the receipts from here on carry its number."""
        self.iter += 1
        return self.iter

    def listen(self, tap: Callable[[str, dict[str, Any]], None]) -> None:
        """Hand every receipt from now on to ``tap`` too (request spans); one tap at most."""
        self.tap = tap

    def notice(self, key: str, text: str, **fields: Any) -> bool:
        return self.once("notice:" + key, schema.NOTICE, text=text, **fields)

    def violation(self, what: str, **numbers: Any) -> bool:
        """An invariant failed: said once per kind of failure."""
        return self.once("violation:" + what, schema.INVARIANT_VIOLATION, what=what, **numbers)

    def of(self, event: str) -> list[dict[str, Any]]:
        """Captured receipts of one kind (capture mode only)."""
        return [r for r in self.records or [] if r["event"] == event]

    def close(self) -> None:
        """Close the boot log. Never raises (nothing is buffered to fail on a full disk)."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError as e:
                print(f"attest: closing the boot log failed ({e})", file=sys.stderr)
            self._file = None
            self._loggers = []
