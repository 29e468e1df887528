"""The ``invariant`` claim kind: a relation on the fields of each selected record. A record that
breaks it is a FAIL even in an incomplete log; a record it cannot be evaluated on is UNDECIDED.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from audit import expr
from audit.checker import Bus, Checker, Context, locate, outcome
from audit.kinds.base import ClaimKind, record_check, select
from audit.model import Claim, ReceiptSel
from audit.parse_select import Events
from audit.status import ClaimVerdict, Status


@dataclass(slots=True, frozen=True, kw_only=True)
class InvariantClaim(Claim):
    select: tuple[ReceiptSel, ...]
    check: expr.Expr  # over one record's fields


def parse(t: dict[str, Any], where: str, head: Claim, events: Events) -> InvariantClaim:
    sel = select(t, where, events)
    return InvariantClaim(**head.common(), select=sel, check=record_check(t, where, sel))


class Invariant(Checker[InvariantClaim]):
    """A relation on the fields of each matching receipt."""

    def __init__(self, claim: InvariantClaim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.checked = self.broken = self.unevaluable = 0
        self.first_broken: str | None = None
        self.first_missing: str | None = None
        for s in claim.select:
            bus.subscribe(s, self._fn(s))

    def _fn(self, s: ReceiptSel) -> Callable[[dict[str, Any]], None]:
        check = self.claim.check

        def fn(rec: dict[str, Any]) -> None:
            if s.where and not s.matches(rec):
                return
            try:
                ok = check(rec)
            except expr.Missing as e:
                self.unevaluable += 1
                if self.first_missing is None:
                    self.first_missing = f"{locate(rec)} has no {e.name}"
                return
            except (TypeError, expr.ZeroDivision):
                self.unevaluable += 1
                if self.first_missing is None:
                    self.first_missing = f"{locate(rec)}: {check.source} cannot be evaluated"
                return
            self.checked += 1
            if not ok:
                self.broken += 1
                if self.first_broken is None:
                    self.first_broken = f"{locate(rec)}: {check.source}: {check.shown(rec)}"

        return fn

    def decide(self, ctx: Context) -> ClaimVerdict:
        c = self.claim
        nums = {"checked": self.checked, "broken": self.broken, "unevaluable": self.unevaluable}
        if self.broken:
            return outcome(
                Status.FAIL,
                f"{self.broken} of {self.checked} receipts break it; first: {self.first_broken}",
                **nums,
            )
        sel = " | ".join(s.describe() for s in c.select)
        gated = self.gate(
            ctx, self.checked + self.unevaluable > 0, f"no {sel} seen: nothing to check"
        )
        if gated:
            gated.numbers.update(nums)
            return gated
        if self.unevaluable:
            return outcome(
                Status.UNDECIDED,
                f"{self.unevaluable} receipt(s) cannot be checked; first: {self.first_missing}",
                "missing_field",
                **nums,
            )
        return outcome(
            Status.PASS, f"{c.check.source} holds in all {self.checked} {sel} receipts", **nums
        )


KINDS = (ClaimKind("invariant", frozenset({"select", "check"}), parse, Invariant, can_fail=True),)
