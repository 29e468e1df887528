"""The ``every`` claim kind: each key with a ``when`` record has a ``then`` record later on the
same (boot, rank), before the key's window closes (at a ``closes`` record of that key, boot.stop,
or one of the claim's ``stops``). With ``tally``, the verdict says how many keys each ``then``
closed (each key once, under the first selector in ``then`` that followed it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audit.checker import Bus, Checker, Context, name_some, outcome
from audit.foreign import TEXT_BOOT
from audit.kinds.base import ClaimKind, stops
from audit.lastseq import highest
from audit.model import Claim, ReceiptSel
from audit.parse_select import Events, err, field, one_stream, selectors
from audit.status import ClaimVerdict, Status
from engine.obs import schema


@dataclass(slots=True, frozen=True, kw_only=True)
class EveryClaim(Claim):
    when: tuple[ReceiptSel, ...]
    then: tuple[ReceiptSel, ...]
    when_key: str = "rid"
    then_key: str = "rid"
    closes: tuple[ReceiptSel, ...] = ()  # a key's terminal events (boot.stop closes all)
    close_key: str = "rid"
    stops: tuple[ReceiptSel, ...] = ()  # records that end the run, as boot.stop ends a rank's
    tally: bool = False  # count the keys each `then` selector closed


def parse(t: dict[str, Any], where: str, head: Claim, events: Events) -> EveryClaim:
    if "when" not in t or "then" not in t:
        raise err(where, "needs 'when' and 'then'")
    when = selectors(t["when"], f"{where} when", receipts_only=True, events=events)
    then = selectors(t["then"], f"{where} then", receipts_only=True, events=events)
    when_key = t.get("when_key", t.get("key", "rid"))
    then_key = t.get("then_key", t.get("key", "rid"))
    for s in when:
        field(s, when_key, f"{where} when_key")
    for s in then:
        field(s, then_key, f"{where} then_key")
    receipts = all(s.event is None for s in when)
    closes, close_key = _closes(t, where, when_key, receipts, events)
    ends = stops(t, where, events)
    one_stream((*when, *then, *closes, *ends), where)
    if not isinstance(t.get("tally", False), bool):
        raise err(where, "tally is true or false")
    return EveryClaim(
        **head.common(),
        when=when,
        then=then,
        when_key=when_key,
        then_key=then_key,
        closes=closes,
        close_key=close_key,
        stops=ends,
        tally=t.get("tally", False),
    )


# where a request's life ends: the default close of an `every` claim keyed on requests
_REQUEST_ENDS = (schema.REQUEST_FINISH, schema.REQUEST_ABORT, schema.REQUEST_REJECT)


def _closes(
    t: dict[str, Any], where: str, when_key: str, receipts: bool, events: Events
) -> tuple[tuple[ReceiptSel, ...], str]:
    """The records that close a key's window, and the key they carry. A request key (``rid``,
    ``rids``) of receipts closes at the request's ending unless the spec names others
    (``closes = []``: only boot.stop closes); a text event's key has no default close."""
    request_key = receipts and when_key in ("rid", "rids")
    close_key = t.get("close_key", "rid" if request_key else when_key)
    if "closes" in t:
        given = t["closes"]
        closes = (
            ()
            if given == []
            else selectors(given, f"{where} closes", receipts_only=True, events=events)
        )
    else:
        closes = tuple(ReceiptSel(k) for k in _REQUEST_ENDS) if request_key else ()
    for s in closes:
        field(s, close_key, f"{where} close_key")
    return closes, close_key


class Every(Checker[EveryClaim]):
    """Each key with a `when` receipt has a `then` receipt at a higher seq on the same rank,
    before the key's window closes: at a `closes` receipt of that key (for request keys, by
    default, the request's finish, abort or reject) or at boot.stop. A window that closed without
    the follow-up is a FAIL, boot.stop or not; one still open where the log ends is UNDECIDED."""

    def __init__(self, claim: EveryClaim, bus: Bus) -> None:
        super().__init__(claim, bus)
        # each role's records: per (boot, rank), each key's highest seq (the state that grows
        # with the number of requests, shared with every claim that reads the same)
        self.when = [bus.last_seq(s, claim.when_key) for s in claim.when]
        self.then = [bus.last_seq(s, claim.then_key) for s in claim.then]
        self.closes = [bus.last_seq(s, claim.close_key) for s in claim.closes]
        self.stops: dict[tuple[str, int], int] = {}
        self.closed_by = dict.fromkeys((s.describe() for s in claim.then), 0)  # with tally
        bus.kinds[schema.BOOT_STOP].append(self._stop)
        for s in claim.stops:
            bus.subscribe(s, lambda rec, s=s: self._stop(rec) if s.matches(rec) else None)

    def _stop(self, rec: dict[str, Any]) -> None:
        key = (rec["boot"], rec["rank"])
        self.stops[key] = max(self.stops.get(key, 0), rec["seq"])

    def _line(self, k: Any, seq: int) -> str | None:
        """Where the text line of a key's `when` at ``seq`` is."""
        return next(
            (w.where.get(k) for w in self.when if w.tables.get((TEXT_BOOT, 0), {}).get(k) == seq),
            None,
        )

    def _windows(self, opened: str) -> tuple[int, list[tuple[str, str]], list[str]]:
        """(keys with a `when`, [(key, how its window closed)] without a follow-up, open keys);
        ``opened``: what to call the `when` receipt in a sentence."""
        total, failed, open_ = 0, [], []
        ended = "the run ended" if self.claim.stops else "boot.stop"
        for at in sorted({at for w in self.when for at in w.tables}):
            boot, rank = at
            stop = self.stops.get(at, 0)
            thens = [t for i in self.then if (t := i.tables.get(at))]
            closes = [t for i in self.closes if (t := i.tables.get(at))]
            whens = highest([t for i in self.when if (t := i.tables.get(at)) is not None])
            total += len(whens)
            if self.claim.tally:
                self._tally(at, whens)
            late: Any = whens.items()  # the keys no `then` followed (yet), table by table
            for t in thens:
                late = [(k, a) for k, a in late if t.get(k, 0) <= a]
            for k, a in late:
                c = max((t.get(k, 0) for t in closes), default=0)
                name, seen, closed = f"{k} (rank {rank})", f"seq {a}", f" at seq {c}"
                if boot == TEXT_BOOT:  # a text line is named by its place in the file
                    name, seen, closed = f"{self.claim.when_key} {k!r}", self._line(k, a), " later"
                    stop_at = f"{ended} later"
                else:
                    stop_at = f"{ended} at seq {stop}"
                if c > a:
                    failed.append((name, f"{opened} at {seen}, its window closed{closed}"))
                elif stop > a:
                    failed.append((name, f"{opened} at {seen}, {stop_at}"))
                else:
                    open_.append(name)
        return total, sorted(failed), sorted(open_)

    def _tally(self, at: tuple[str, int], whens: dict[Any, int]) -> None:
        """Each key under the first `then` selector (in the spec's order) that followed it."""
        tables = [(s.describe(), i.tables.get(at, {})) for s, i in zip(self.claim.then, self.then)]
        for k, a in whens.items():
            by = next((name for name, t in tables if t.get(k, 0) > a), None)
            if by is not None:
                self.closed_by[by] += 1

    def _counted(self) -> tuple[str, dict[str, Any]]:
        """With tally: what closed the keys, as a clause and a number."""
        if not self.claim.tally:
            return "", {}
        said = ", ".join(f"{n} by {name}" for name, n in self.closed_by.items())
        return f" ({said})", {"closed_by": dict(self.closed_by)}

    def _ends(self) -> str:
        """What closes a window, for a sentence."""
        ends = [s.describe() for s in (*self.claim.closes, *self.claim.stops)]
        if self.claim.when[0].event is None:
            ends.append("boot.stop")
        return " or ".join(ends)

    def decide(self, ctx: Context) -> ClaimVerdict:
        c = self.claim
        when = " | ".join(s.describe() for s in c.when)
        label = "rid" if c.when_key in ("rid", "rids") else c.when_key
        then = " | ".join(s.describe() for s in c.then)
        total, failed, open_ = self._windows(c.when[0].kind if len(c.when) == 1 else "when")
        gated = self.gate(ctx, total > 0, f"no {when} seen: nothing to follow")
        nums = {"keys": total, "failed": len(failed), "open": len(open_)}
        counted, tally = self._counted()
        nums.update(tally)
        if gated:
            gated.numbers.update(nums)
            return gated
        if failed:
            names = [name for name, _ in failed]
            return outcome(
                Status.FAIL,
                f"{len(failed)} of {total} {label}s from {when} had no later {then} before their "
                f"window closed (at {self._ends()}): {name_some(names)}; "
                f"first: {names[0]}: {failed[0][1]}{counted}",
                failed_keys=names[:50],
                **nums,
            )
        if open_:
            return outcome(
                Status.UNDECIDED,
                f"{len(open_)} of {total} {label}s from {when} are still open where the log "
                f"ends and nothing ended the run after them ({self._ends()}; still running, or "
                f"the log was cut): {name_some(open_)}",
                "in_flight_at_end",
                open_keys=open_[:50],
                **nums,
            )
        return outcome(
            Status.PASS, f"all {total} {label}s from {when} later had {then}{counted}", **nums
        )


_KEYS = {"when", "then", "key", "when_key", "then_key", "closes", "close_key", "stops", "tally"}
KINDS = (ClaimKind("every", frozenset(_KEYS), parse, Every, can_fail=True),)
