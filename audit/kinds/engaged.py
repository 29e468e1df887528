"""The ``engaged`` claim kind: the window reached its regime, at least ``min`` records or lines
matched. It is PASS or UNDECIDED by design: a signal that never appeared is not a decided
negative, so it cannot FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audit.checker import Bus, Checker, Context, SelCount, outcome
from audit.kinds.base import ClaimKind, select
from audit.model import Claim, ReceiptSel
from audit.parse_select import Events, err
from audit.status import ClaimVerdict, Status


@dataclass(slots=True, frozen=True, kw_only=True)
class EngagedClaim(Claim):
    select: tuple[ReceiptSel, ...]
    min: int = 1


def parse(t: dict[str, Any], where: str, head: Claim, events: Events) -> EngagedClaim:
    sel = select(t, where, events)
    if not isinstance(t.get("min", 1), int) or t.get("min", 1) < 1:
        raise err(where, "'min' is an integer >= 1")
    return EngagedClaim(**head.common(), select=sel, min=t.get("min", 1))


class Engaged(Checker[EngagedClaim]):
    needs_complete = False

    def __init__(self, claim: EngagedClaim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.sel = SelCount(claim.select, bus)

    def decide(self, ctx: Context) -> ClaimVerdict:
        n, need = self.sel.count, self.claim.min
        desc = self.sel.describe()
        gated = self.gate(
            ctx, n >= need, f"{n} {desc} seen, {need} needed: the window never reached its regime"
        )
        if gated:
            gated.numbers.update(seen=n, min=need)
            return gated
        return outcome(
            Status.PASS, f"{n} {desc} seen (>= {need}); first: {self.sel.first}", seen=n, min=need
        )


KINDS = (ClaimKind("engaged", frozenset({"select", "min"}), parse, Engaged, can_fail=False),)
