"""How a claim's checker sees the log: the ``Bus`` that hands each line to whoever subscribed,
``SelCount`` (lines matching a claim's selectors, the ``wedge`` signal of ``audit.wedge`` among
them), and the ``Checker`` base class with the gates every claim kind shares.

The order of the gates is the same for every kind:
1. evidence that decides a FAIL by itself (a `never` signature seen, an `invariant` broken) is
   a FAIL even in an incomplete log -- a lost line cannot un-happen what was read;
2. an incomplete log (seq gap or an invalid seq, duplicates, unparsed lines) makes every claim
   that needs all the receipts UNDECIDED with the reader's reason;
3. a mechanism that never engaged is UNDECIDED (``no_engagement``), or a PASS marked
   ``vacuous`` where the claim says ``allow_vacuous = true``; never where the claim has a FAIL
   in hand (``gate(..., failing=True)``: what it ``requires`` unseen does not hide a failure
   the log shows, as an engine that died before its first stats line);
4. a claim about the whole boot (``needs_end = true``) over a log that ends with requests in
   flight and no boot.stop is UNDECIDED (``in_flight_at_end``), unless the log is a live
   window's (``audit.live``): its end is the window's, and the claim decides as of there;
5. then the claim decides.

"Later" means a higher ``seq`` on the same (boot, rank), so no verdict depends on the order in
which the lines of different ranks (or files) were interleaved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from audit.foreign import TEXT_BOOT, Found, Matcher, plain
from audit.model import Claim, ReceiptSel, Selector, TextEvent, TextSel, WedgeSel
from audit.reader import TEXT
from audit.readstats import ReadStats
from audit.status import ClaimVerdict, Status
from audit.wedge import Wedge, WedgeDetector
from engine.observability import schema

C = TypeVar("C", bound=Claim)  # a kind's own claim type
T = TypeVar("T")
MAX_NAMED = 5  # rids named in a sentence
_OPENS, _ENDS = (schema.REQUEST_RECEIVED,), (schema.REQUEST_FINISH, schema.REQUEST_ABORT)


class Bus:
    """Who wants which lines: receipts by kind, receipts of any kind, text lines by source, and
    the events the specs' text events make of text lines (by definition)."""

    def __init__(self, *, exact: bool = False) -> None:
        self.exact = exact  # keep all a claim could need, even what one rank's boot never does
        self.kinds: dict[str, list[Callable[[dict[str, Any]], None]]] = defaultdict(list)
        self.any: list[Callable[[dict[str, Any]], None]] = []
        self.texts: dict[str, list[Callable[[str, str], None]]] = defaultdict(list)
        self.events: dict[TextEvent, list[Callable[[dict[str, Any]], None]]] = {}
        self.text_lines = 0  # text lines read so far: a text event's ``seq`` (line order)
        self._matcher: Matcher | None = None
        self._shared: dict[Any, Any] = {}

    def shared(self, key: Any, make: Callable[[], T]) -> T:
        """One ``make()`` for all who ask by the same key (hashable: a TypeError where not): the
        state that claims reading the same records keep alike, kept once."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    def shared_keys(self) -> frozenset[Any]:
        """The keys of the state kept once for all who asked (readings planned together share
        it: ``audit.verdict._plan``)."""
        return frozenset(self._shared)

    def subscribe(self, sel: ReceiptSel, fn: Callable[[dict[str, Any]], None]) -> None:
        """``fn`` gets every record of ``sel``'s kind: receipts, or its text event's events."""
        if sel.event is None:
            self.kinds[sel.kind].append(fn)
        else:
            self.events.setdefault(sel.event, []).append(fn)
            self._matcher = None

    def receipt(self, rec: dict[str, Any]) -> None:
        for fn in self.kinds.get(rec["event"], ()):
            fn(rec)
        for fn in self.any:
            fn(rec)

    def text(self, source: str, line: str, where: str) -> None:
        """A text line: plain lines lose their outer layers (a collector's prefix, a process
        tag) before text selectors see them, and make the text events they start with."""
        line = plain(line)
        self.text_lines += 1
        found: Found = []
        if source == TEXT and (self.events or self.texts.get(TEXT)):
            if self._matcher is None:
                self._matcher = Matcher(self.events)
            line, found = self._matcher.read(line)
        for fn in self.texts.get(source, ()):
            fn(line, where)
        for ev, fields in found:
            rec = {"event": ev.name, "boot": TEXT_BOOT, "rank": 0, "seq": self.text_lines}
            rec.update(fields, where=where)
            for fn in self.events[ev]:
                fn(rec)


@dataclass(slots=True)
class Context:
    """What a checker may consult when it decides: how the log (and the control log) read."""

    stats: ReadStats
    control_stats: ReadStats | None = None
    live: bool = False  # a live window (``audit.live``): the run goes on past the log's last line


def locate(rec: dict[str, Any]) -> str:
    """Where a receipt is, for a sentence: its kind, boot, rank, seq, iter and rid (a text
    event: its kind, file and line)."""
    if rec.get("boot") == TEXT_BOOT:
        return f"{rec['event']} line at {rec.get('where')}"
    rid = f" rid {rec['rid']}" if "rid" in rec else ""
    return f"{rec['event']} (boot {rec['boot']} rank {rec['rank']} seq {rec['seq']} iter {rec.get('iter')}{rid})"


def name_some(items: list[str], total: int | None = None) -> str:
    """The first ``MAX_NAMED`` items, and how many more (of ``total``, where only the first
    few were kept)."""
    shown = ", ".join(items[:MAX_NAMED])
    n = len(items) if total is None else total
    return shown + (f" and {n - MAX_NAMED} more" if n > MAX_NAMED else "")


def describe_wedge(w: Wedge, threshold_s: float) -> str:
    """A wedge in one sentence, with its numbers and the receipts at both ends."""
    where = f"from {locate(w.start)} to {locate(w.end)}"
    if w.end.get("event") == schema.SCHEDULER_RESUME:  # the loop stood still
        s, arrived = w.start, w.end.get("arrived")
        held = f"running {s.get('running')}, waiting {s.get('waiting')}, parked {s.get('parked')}"
        return (
            f"the scheduler stood still for {w.seconds:.1f} s > {threshold_s:g} s holding work "
            f"({held}; {arrived} arrived while it stood), {where}"
        )
    if w.counters is None:  # the scheduling rule: a log whose iterations lack the counters
        return (
            f"work waited {w.seconds:.1f} s > {threshold_s:g} s with no tokens scheduled, {where}"
        )
    held = f"waiting {w.start.get('waiting')}, parked {w.start.get('parked')}"
    moved = ", ".join(f"{n} {v}" for n, v in zip(schema.PROGRESS, w.counters, strict=True))
    return (
        f"no progress for {w.seconds:.1f} s > {threshold_s:g} s while work waited ({held}): "
        f"{moved} unchanged, {where}"
    )


class SelCount:
    """How many lines matched any of the selectors, and the first one (for the sentence)."""

    def __init__(self, sels: tuple[Selector, ...], bus: Bus) -> None:
        self.sels = sels
        self.hits = 0  # receipts and lines matched
        # of them, events of a spec's text events: lines in an engine's own head, which only
        # that engine writes (a whole-line text selector's match may be any program's)
        self.own_hits = 0
        self.first_hit: str | None = None
        # a wedge is known only once the log is read (each rank's rule depends on all of it)
        self.wedges: list[tuple[WedgeDetector, float]] = []
        for s in sels:
            if isinstance(s, ReceiptSel):
                bus.subscribe(s, self._receipt_fn(s))
            elif isinstance(s, TextSel):
                bus.texts[s.source].append(self._text_fn(s))
            elif isinstance(s, WedgeSel):
                self.wedges.append((WedgeDetector(s.threshold_s), s.threshold_s))
                bus.any.append(self.wedges[-1][0].receiver())

    @property
    def count(self) -> int:
        return self.hits + sum(len(d.found()) for d, _ in self.wedges)

    @property
    def first(self) -> str | None:
        """The first match, described (a wedge's sentence where nothing else matched)."""
        if self.first_hit is not None:
            return self.first_hit
        return next((describe_wedge(w, t) for d, t in self.wedges for w in d.found()), None)

    def _receipt_fn(self, s: ReceiptSel) -> Callable[[dict[str, Any]], None]:
        def fn(rec: dict[str, Any]) -> None:
            if s.where and not s.matches(rec):
                return
            self.hits += 1
            if s.event is not None:
                self.own_hits += 1
            if self.first_hit is None:  # described once, not per match, with what it matched on
                names = [p.field for p in s.where]  # and what caused it, where the record says
                causes = schema.CAUSE_FIELDS.get(s.kind, ()) if s.event is None else ()
                names += [f for f in causes if f in rec]
                shown = ", ".join(f"{f} {rec.get(f)!r}" for f in dict.fromkeys(names))
                self.first_hit = locate(rec) + (f": {shown}" if shown else "")

        return fn

    def _text_fn(self, s: TextSel) -> Callable[[str, str], None]:
        def fn(line: str, where: str) -> None:
            if s.matches(line):
                self.hits += 1
                if self.first_hit is None:
                    self.first_hit = f"{s.source} line at {where}: {line[:120]!r}"

        return fn

    def describe(self) -> str:
        return " | ".join(s.describe() for s in self.sels)


def in_flight_at_end(stats: ReadStats) -> ClaimVerdict | None:
    """UNDECIDED (in_flight_at_end) where a rank's log ends with requests in flight (received
    less finished and aborted, the reader's counts: the order of the lines does not matter) and
    no boot.stop: the engine may still be running, or it died without a word."""
    cut = []
    for key, t in sorted(stats.seqs.items()):
        n = sum(t.kinds[k] for k in _OPENS) - sum(t.kinds[k] for k in _ENDS)
        if n > 0 and not t.kinds[schema.BOOT_STOP]:
            cut.append((key, n))
    if not cut:
        return None
    (boot, rank), n = cut[0]
    return outcome(
        Status.UNDECIDED,
        f"boot {boot} rank {rank}: {n} request(s) received without an ending, and no "
        f"boot.stop: the log ends with work in flight (still running, or it died unheard)"
        + (f"; {len(cut) - 1} more rank(s) alike" if len(cut) > 1 else ""),
        "in_flight_at_end",
        in_flight=sum(n for _, n in cut),
    )


class Checker(Generic[C]):
    """One claim. Subclasses subscribe in ``__init__`` and decide in ``decide``."""

    needs_complete = True
    needs_end = False  # gate 4: a log cut with requests in flight cannot decide the claim

    def __init__(self, claim: C, bus: Bus) -> None:
        self.claim = claim
        self.requires = SelCount(claim.requires, bus) if claim.requires else None
        self.applies = SelCount(claim.applies, bus) if claim.applies else None

    def subscribe_control(self, bus: Bus) -> None:
        """Only `control` claims read the control log."""

    def verdict(self, ctx: Context) -> ClaimVerdict:
        v = self.decide(ctx)
        if v.status is not Status.FAIL and (na := self.not_applicable(ctx)) is not None:
            v = na  # a FAIL stands: what was read cannot be made not to apply
        v.claim, v.kind = self.claim.id, self.claim.kind
        if ctx.live and self.needs_end and v.status is Status.PASS:
            v.why += "; as of the live window's end (the server still ran: no stop was awaited)"
        return v

    def not_applicable(self, ctx: Context) -> ClaimVerdict | None:
        """N/A where nothing the claim applies to is in the log; only a complete log can say
        so (a lost line might have been the one)."""
        if self.applies is None or self.applies.count or ctx.stats.incomplete() is not None:
            return None
        return outcome(
            Status.NOT_APPLICABLE,
            f"{self.applies.describe()} never seen: the claim does not apply to this log",
            "not_applicable",
        )

    def decide(self, ctx: Context) -> ClaimVerdict:
        raise NotImplementedError

    def failed_in_own_words(self, verdict: ClaimVerdict) -> bool:
        """Whether ``verdict`` is a FAIL that rests on lines in an engine's own head (a spec's
        text events): evidence that the log is that engine's, so a window over its logs is
        judged on it though the window's regime was never seen (``audit.verdict``). Kinds
        whose FAIL can rest on such lines say so; receipts and whole lines never do."""
        return False

    def rescan(self, ctx: Context) -> bool:
        """Whether the logs must be read again on an ``exact`` bus to decide: what was left
        unkept (as a one-rank boot needs) turned out to be needed."""
        return False

    # the shared gates (2 and 3 of the module docstring)
    def gate(
        self, ctx: Context, engaged: bool, not_engaged_why: str, *, failing: bool = False
    ) -> ClaimVerdict | None:
        """UNDECIDED (or a vacuous PASS) where the log cannot decide the claim. ``failing``:
        the claim has a FAIL in hand, read in the log; then only an incomplete log holds it
        back (a lost line might be the one that answers it), never the engagement gate (what
        the claim ``requires`` unseen, nothing engaged) nor the log's end: a failure seen is
        not unknown."""
        incomplete = ctx.stats.incomplete()
        if self.needs_complete and incomplete is not None:
            return outcome(Status.UNDECIDED, incomplete[1], incomplete[0])
        if failing:
            return None
        if self.requires is not None and self.requires.count == 0:
            engaged = False
            not_engaged_why = f"{self.requires.describe()} never seen: the mechanism never engaged"
        if not engaged:
            if self.claim.allow_vacuous:
                return outcome(
                    Status.PASS, f"vacuous pass (allowed by the spec): {not_engaged_why}", "vacuous"
                )
            return outcome(Status.UNDECIDED, not_engaged_why, "no_engagement")
        if self.needs_end and not ctx.live:
            return in_flight_at_end(ctx.stats)
        return None


def outcome(status: Status, why: str, reason: str | None = None, **numbers: Any) -> ClaimVerdict:
    """A verdict without its claim's id and kind (``Checker.verdict`` fills them in)."""
    return ClaimVerdict("", "", status, why, reason, numbers)
