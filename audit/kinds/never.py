"""The ``never`` claim kind: no record or line matches, in a log shown to have been observed
(``requires``); a signature seen is a FAIL even in an incomplete log. It is the one kind whose
selectors may be text lines or a derived signal (``wedge``), and the one that may ask for the
boot's end (``needs_end``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audit.checker import Bus, Checker, Context, SelCount, outcome
from audit.kinds.base import ClaimKind, select
from audit.model import Claim, Selector
from audit.parse_select import Events, err
from audit.status import ClaimVerdict, Status


@dataclass(slots=True, frozen=True, kw_only=True)
class NeverClaim(Claim):
    select: tuple[Selector, ...]  # receipts, text events, text lines or a signal
    needs_end: bool = False  # a log cut with requests in flight cannot decide it


def parse(t: dict[str, Any], where: str, head: Claim, events: Events) -> NeverClaim:
    sel = select(t, where, events, receipts_only=False)
    if not head.requires:
        raise err(where, "a 'never' claim needs 'requires': what shows the log was observed")
    needs_end = t.get("needs_end", False)
    if not isinstance(needs_end, bool):
        raise err(where, "needs_end is true or false")
    return NeverClaim(**head.common(), select=sel, needs_end=needs_end)


class Never(Checker[NeverClaim]):
    def __init__(self, claim: NeverClaim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.sel = SelCount(claim.select, bus)
        self.needs_end = claim.needs_end

    def decide(self, ctx: Context) -> ClaimVerdict:
        n = self.sel.count
        if n:
            return outcome(
                Status.FAIL, f"{n} x {self.sel.describe()}; first: {self.sel.first}", found=n
            )
        gated = self.gate(ctx, True, "")
        if gated:
            gated.numbers.update(found=0)
            return gated
        st = ctx.stats
        return outcome(
            Status.PASS,
            f"none of {self.sel.describe()} in {st.receipts} receipts and {st.text + st.foreign_json} "
            f"text lines ({self.requires.describe()} seen {self.requires.count})",
            found=0,
        )

    def failed_in_own_words(self, verdict: ClaimVerdict) -> bool:
        return verdict.status is Status.FAIL and self.sel.own_hits > 0


KINDS = (ClaimKind("never", frozenset({"select", "needs_end"}), parse, Never, can_fail=True),)
