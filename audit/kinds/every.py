"""The ``every`` claim kind: each key with a ``when`` record has a ``then`` record later on the
same (boot, rank), before the key's window closes (at a ``closes`` record of that key, boot.stop,
or one of the claim's ``stops``). With ``tally``, the verdict says how many windows each ``then``
closed (each window once, under the first selector in ``then`` that followed it). The windows
are ``audit.followups``'s: a key used again after its window closed opens another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audit.checker import Bus, Checker, Context, name_some, outcome
from audit.followups import Followups
from audit.kinds.base import ClaimKind, stops
from audit.model import Claim, ReceiptSel
from audit.parse_select import Events, err, field, one_stream, selectors
from audit.status import ClaimVerdict, Status
from engine.observability import schema


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
    the follow-up is a FAIL, boot.stop or not; one still open where the log ends is UNDECIDED.
    The windows are ``audit.followups``'s, shared by the claims that read the same."""

    def __init__(self, claim: EveryClaim, bus: Bus) -> None:
        super().__init__(claim, bus)
        c = claim
        roles = (
            tuple((s, c.when_key) for s in c.when),
            tuple((s, c.then_key) for s in c.then),
            tuple((s, c.close_key) for s in c.closes),
            c.stops,
        )
        opened = c.when[0].kind if len(c.when) == 1 else "when"
        ended = "the run ended" if c.stops else "boot.stop"

        def make() -> Followups:
            return Followups(
                *roles,
                when_key=c.when_key,
                opened=opened,
                ended=ended,
                subscribe=bus.subscribe,
                exact=bus.exact,
            )

        try:
            self.windows = bus.shared(("every", roles, c.when_key, opened, ended), make)
        except TypeError:  # a selector whose values cannot be hashed reads for itself
            self.windows = make()

    def rescan(self, ctx: Context) -> bool:
        return self.windows.disordered

    def _counted(self, by_then: list[int]) -> tuple[str, dict[str, Any]]:
        """With tally: what closed the keys, as a clause and a number."""
        if not self.claim.tally:
            return "", {}
        closed_by = {s.describe(): n for s, n in zip(self.claim.then, by_then)}
        said = ", ".join(f"{n} by {name}" for name, n in closed_by.items())
        return f" ({said})", {"closed_by": closed_by}

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
        total, n_failed, failed, open_, by_then = self.windows.summary()
        gated = self.gate(
            ctx, total > 0, f"no {when} seen: nothing to follow", failing=bool(failed)
        )
        nums = {"keys": total, "failed": n_failed, "open": len(open_)}
        counted, tally = self._counted(by_then)
        nums.update(tally)
        if gated:
            gated.numbers.update(nums)
            return gated
        if failed:
            names = [name for name, _ in failed]
            return outcome(
                Status.FAIL,
                f"{n_failed} of {total} {label}s from {when} had no later {then} before their "
                f"window closed (at {self._ends()}): {name_some(names, n_failed)}; "
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

    def failed_in_own_words(self, verdict: ClaimVerdict) -> bool:
        """A window closed without its follow-up, opened by an engine's own line."""
        own = all(s.event is not None for s in self.claim.when)
        return verdict.status is Status.FAIL and own


_KEYS = {"when", "then", "key", "when_key", "then_key", "closes", "close_key", "stops", "tally"}
KINDS = (ClaimKind("every", frozenset(_KEYS), parse, Every, can_fail=True),)
