"""How a claim's checker sees the log: the ``Bus`` that hands each line to whoever subscribed,
``SelCount`` (lines matching a claim's selectors, the ``wedge`` signal among them), and the
``Checker`` base class with the gates every claim kind shares.

The order of the gates is the same for every kind:
1. evidence that decides a FAIL by itself (a `never` signature seen, an `invariant` broken) is
   a FAIL even in an incomplete log -- a lost line cannot un-happen what was read;
2. an incomplete log (seq gap, duplicates, unparsed lines) makes every claim that needs all the
   receipts UNDECIDED with the reader's reason;
3. a mechanism that never engaged is UNDECIDED (``no_engagement``), or a PASS marked
   ``vacuous`` where the claim says ``allow_vacuous = true``;
4. then the claim decides.

"Later" means a higher ``seq`` on the same (boot, rank), so no verdict depends on the order in
which the lines of different ranks (or files) were interleaved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from audit.model import Claim, ReceiptSel, Selector, TextSel, WedgeSel
from audit.reader import ReadStats
from audit.status import ClaimVerdict, Status
from engine.obs import schema

MAX_NAMED = 5  # rids named in a sentence


class Bus:
    """Who wants which lines: receipts by kind, receipts of any kind, text lines by source."""

    def __init__(self) -> None:
        self.kinds: dict[str, list[Callable[[dict[str, Any]], None]]] = defaultdict(list)
        self.any: list[Callable[[dict[str, Any]], None]] = []
        self.texts: dict[str, list[Callable[[str, str], None]]] = defaultdict(list)

    def receipt(self, rec: dict[str, Any]) -> None:
        for fn in self.kinds.get(rec["event"], ()):
            fn(rec)
        for fn in self.any:
            fn(rec)

    def text(self, source: str, line: str, where: str) -> None:
        for fn in self.texts.get(source, ()):
            fn(line, where)


@dataclass(slots=True)
class Context:
    """What a checker may consult when it decides: how the log (and the control log) read."""

    stats: ReadStats
    control_stats: ReadStats | None = None


def locate(rec: dict[str, Any]) -> str:
    """Where a receipt is, for a sentence: its kind, boot, rank, seq, iter and rid."""
    rid = f" rid {rec['rid']}" if "rid" in rec else ""
    return f"{rec['event']} (boot {rec['boot']} rank {rec['rank']} seq {rec['seq']} iter {rec.get('iter')}{rid})"


def name_some(items: list[str]) -> str:
    """The first ``MAX_NAMED`` items, and how many more."""
    shown = ", ".join(items[:MAX_NAMED])
    return shown + (f" and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else "")


class WedgeDetector:
    """Work waiting while no tokens are scheduled, per (boot, rank), in receipt time.

    Waiting starts at a receipt that shows requests held back (``admission.defer``,
    ``admission.park``, an ``iteration`` with waiting + parked > 0) and ends at the next
    receipt that shows tokens scheduled (``admission.admit``, ``admission.unpark``,
    ``request.finish``, ``request.abort``, an ``iteration`` with running > 0) or an
    ``iteration`` with nothing waiting, parked or running. Each receipt of the rank measures
    the span so far; a span longer than the threshold is a wedge.
    """

    PROGRESS = frozenset(
        (
            schema.ADMISSION_ADMIT,
            schema.ADMISSION_UNPARK,
            schema.REQUEST_FINISH,
            schema.REQUEST_ABORT,
        )
    )

    def __init__(self, threshold_s: float, on_wedge: Callable[[str], None]) -> None:
        self.threshold_s = threshold_s
        self.on_wedge = on_wedge
        self.since: dict[tuple[str, int], tuple[float, dict[str, Any]]] = {}
        self.reported: set[tuple[str, int, float]] = set()

    def feed(self, rec: dict[str, Any]) -> None:
        ts = rec.get("ts")
        if not isinstance(ts, int | float):
            return
        key = (rec["boot"], rec["rank"])
        start = self.since.get(key)
        if start is not None and ts - start[0] > self.threshold_s:
            mark = (key[0], key[1], start[0])
            if mark not in self.reported:
                self.reported.add(mark)
                self.on_wedge(
                    f"work waited {ts - start[0]:.1f} s > {self.threshold_s:g} s with no tokens "
                    f"scheduled, from {locate(start[1])} to {locate(rec)}"
                )
        event = rec["event"]
        if event in self.PROGRESS or event == schema.BOOT_STOP:
            self.since.pop(key, None)
        elif event == schema.ITERATION:
            running = rec.get("running") or 0
            held = (rec.get("waiting") or 0) + (rec.get("parked") or 0)
            if running > 0 or held == 0:
                self.since.pop(key, None)
            elif start is None:
                self.since[key] = (ts, rec)
        elif event in (schema.ADMISSION_DEFER, schema.ADMISSION_PARK) and start is None:
            self.since[key] = (ts, rec)


class SelCount:
    """How many lines matched any of the selectors, and the first one (for the sentence)."""

    def __init__(self, sels: tuple[Selector, ...], bus: Bus) -> None:
        self.sels = sels
        self.count = 0
        self.first: str | None = None
        for s in sels:
            if isinstance(s, ReceiptSel):
                bus.kinds[s.kind].append(self._receipt_fn(s))
            elif isinstance(s, TextSel):
                bus.texts[s.source].append(self._text_fn(s))
            elif isinstance(s, WedgeSel):
                bus.any.append(WedgeDetector(s.threshold_s, self._hit).feed)

    def _hit(self, what: str) -> None:
        self.count += 1
        if self.first is None:
            self.first = what

    def _receipt_fn(self, s: ReceiptSel) -> Callable[[dict[str, Any]], None]:
        def fn(rec: dict[str, Any]) -> None:
            if s.where and not s.matches(rec):
                return
            self.count += 1
            if self.first is None:  # described once, not per match
                self.first = locate(rec)

        return fn

    def _text_fn(self, s: TextSel) -> Callable[[str, str], None]:
        def fn(line: str, where: str) -> None:
            if s.matches(line):
                self.count += 1
                if self.first is None:
                    self.first = f"{s.source} line at {where}: {line[:120]!r}"

        return fn

    def describe(self) -> str:
        return " | ".join(s.describe() for s in self.sels)


class Checker:
    """One claim. Subclasses subscribe in ``__init__`` and decide in ``decide``."""

    needs_complete = True

    def __init__(self, claim: Claim, bus: Bus) -> None:
        self.claim = claim
        self.requires = SelCount(claim.requires, bus) if claim.requires else None

    def subscribe_control(self, bus: Bus) -> None:
        """Only `control` claims read the control log."""

    def verdict(self, ctx: Context) -> ClaimVerdict:
        v = self.decide(ctx)
        v.claim, v.kind = self.claim.id, self.claim.kind
        return v

    def decide(self, ctx: Context) -> ClaimVerdict:
        raise NotImplementedError

    # the shared gates (2 and 3 of the module docstring)
    def gate(self, ctx: Context, engaged: bool, not_engaged_why: str) -> ClaimVerdict | None:
        if self.requires is not None and self.requires.count == 0:
            engaged = False
            not_engaged_why = f"{self.requires.describe()} never seen: the mechanism never engaged"
        incomplete = ctx.stats.incomplete()
        if self.needs_complete and incomplete is not None:
            return outcome(Status.UNDECIDED, incomplete[1], incomplete[0])
        if not engaged:
            if self.claim.allow_vacuous:
                return outcome(
                    Status.PASS, f"vacuous pass (allowed by the spec): {not_engaged_why}", "vacuous"
                )
            return outcome(Status.UNDECIDED, not_engaged_why, "no_engagement")
        return None


def outcome(status: Status, why: str, reason: str | None = None, **numbers: Any) -> ClaimVerdict:
    """A verdict without its claim's id and kind (``Checker.verdict`` fills them in)."""
    return ClaimVerdict("", "", status, why, reason, numbers)
