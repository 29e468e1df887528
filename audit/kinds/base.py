"""What a claim kind's module declares (``ClaimKind``), and the pieces of parsing that several
kinds share: the ``select`` every selecting kind reads, expressions checked against the names in
scope, a check over one record's fields, and the records that end a run (``stops``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from audit import expr
from audit.checker import Bus, Checker
from audit.model import Claim, ReceiptSel, Selector
from audit.parse_select import Events, err, known_fields, selectors

# (the [[claim]] table, where it is for an error, the common part parsed, the spec's text events)
Parser = Callable[[dict[str, Any], str, Claim, Events], Claim]


@dataclass(slots=True, frozen=True)
class ClaimKind:
    """One claim kind, declared once in its module and registered in ``audit.kinds.KINDS``."""

    name: str  # what a spec's ``kind = "..."`` says
    keys: frozenset[str]  # the kind's own keys in a [[claim]] table, besides the common ones
    parse: Parser  # the kind's own claim, checked against the schema and the spec's events
    checker: Callable[[Any, Bus], Checker]  # reads the log for one claim and decides it
    # False where the kind is PASS or UNDECIDED by design (the self-test then asks no FAIL case)
    can_fail: bool


def select(
    t: dict[str, Any], where: str, events: Events, *, receipts_only: bool = True
) -> tuple[Selector, ...]:
    """The claim's required ``select``."""
    if "select" not in t:
        raise err(where, "needs 'select'")
    return selectors(t["select"], f"{where} select", receipts_only=receipts_only, events=events)


def expression(src: Any, where: str, names: set[str], comparison: bool | None) -> expr.Expr:
    """An expression that names only ``names``; ``comparison``: whether it must be one."""
    if not isinstance(src, str):
        raise err(where, f"expected an expression string, got {src!r}")
    try:
        e = expr.parse(src, comparison=comparison)
    except expr.ExprError as e_:
        raise err(where, str(e_)) from None
    unknown = sorted(e.names - names)
    if unknown:
        raise err(where, f"{src!r} names {', '.join(unknown)}, not defined here")
    return e


def record_check(t: dict[str, Any], where: str, sels: tuple[ReceiptSel, ...]) -> expr.Expr:
    """A comparison over one record's fields: only fields every selected kind knows."""
    if "check" not in t:
        raise err(where, "needs 'check'")
    allowed = set.intersection(*(set(known_fields(s)) for s in sels))
    return expression(t["check"], f"{where} check", allowed, comparison=True)


def stops(t: dict[str, Any], where: str, events: Events) -> tuple[ReceiptSel, ...]:
    """Records that end the run, as boot.stop ends its rank's (a server's shutdown line)."""
    if "stops" not in t:
        return ()
    return selectors(t["stops"], f"{where} stops", receipts_only=True, events=events)
