"""What a spec is once parsed: selectors (which receipts or lines a claim reads), claims, the
regime a window applies to, and the spec that holds them. Plain frozen values; ``audit.parse``
builds them from TOML and checks every name against the schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit import expr
from audit.recipe import Recipe

CLAIM_KINDS = (
    "engaged",
    "never",
    "every",
    "ratio",
    "compare",
    "control",
    "invariant",
    "ranks_agree",
    "final",
)
# the claim kinds that can reach FAIL (an `engaged` claim is PASS or UNDECIDED by design: a signal
# that never appeared is not a decided negative)
CAN_FAIL = frozenset(CLAIM_KINDS) - {"engaged"}
# the operators a field predicate may use (``Pred.test`` knows each one)
OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not_in", "regex", "exists")


@dataclass(slots=True, frozen=True)
class Pred:
    field: str
    op: str
    value: Any

    def test(self, rec: dict[str, Any]) -> bool:
        if self.op == "exists":
            return (rec.get(self.field) is not None) == bool(self.value)
        v = rec.get(self.field)
        if self.op == "==":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        if self.op == "in":
            return v in self.value
        if self.op == "not_in":
            return v not in self.value
        if self.op == "regex":
            return isinstance(v, str) and self.value.fullmatch(v) is not None
        if not isinstance(v, int | float) or isinstance(v, bool):
            return False
        return {
            "<": v < self.value,
            "<=": v <= self.value,
            ">": v > self.value,
            ">=": v >= self.value,
        }[self.op]

    def describe(self) -> str:
        shown = self.value.pattern if self.op == "regex" else self.value
        return f"{self.field} {self.op} {shown!r}"


@dataclass(slots=True, frozen=True)
class TextEvent:
    """A spec's event made of plain text lines of one known log format (``audit.foreign``): a
    line that starts with the format's head, the rest of it matched whole by ``pattern``. Its
    fields are the head's named groups and the pattern's (numbers read as numbers); ``logger``,
    where given, must be the logger the head names."""

    name: str
    format: str
    pattern: re.Pattern[str]
    logger: str | None
    fields: frozenset[str]


@dataclass(slots=True, frozen=True)
class ReceiptSel:
    """Records of one kind: receipts of a catalog kind, or (``event`` set) the events a spec's
    text event makes of text lines. Either way, records with fields that ``where`` tests."""

    kind: str
    where: tuple[Pred, ...] = ()
    event: TextEvent | None = None

    def matches(self, rec: dict[str, Any]) -> bool:
        return all(p.test(rec) for p in self.where)

    def describe(self) -> str:
        kind = self.kind if self.event is None else f"{self.kind} line"
        if not self.where:
            return kind
        return f"{kind}[{', '.join(p.describe() for p in self.where)}]"


@dataclass(slots=True, frozen=True)
class TextSel:
    source: str
    pattern: re.Pattern[str]

    def matches(self, line: str) -> bool:
        return self.pattern.fullmatch(line) is not None

    def describe(self) -> str:
        return f"{self.source} line /{self.pattern.pattern}/"


@dataclass(slots=True, frozen=True)
class WedgeSel:
    threshold_s: float

    def describe(self) -> str:
        return f"wedge > {self.threshold_s:g} s"


Selector = ReceiptSel | TextSel | WedgeSel


@dataclass(slots=True, frozen=True)
class Sum:
    select: tuple[ReceiptSel, ...]
    field: str


@dataclass(slots=True, frozen=True)
class Claim:
    id: str
    kind: str
    description: str = ""
    select: tuple[Selector, ...] = ()
    requires: tuple[Selector, ...] = ()
    allow_vacuous: bool = False
    min: int = 1
    when: tuple[ReceiptSel, ...] = ()
    then: tuple[ReceiptSel, ...] = ()
    when_key: str = "rid"
    then_key: str = "rid"
    closes: tuple[ReceiptSel, ...] = ()  # an `every` key's terminal events (boot.stop closes all)
    close_key: str = "rid"
    stops: tuple[ReceiptSel, ...] = ()  # records that end the run, as boot.stop ends a rank's
    key: str | None = None  # a `final` claim's key: the last record of each is checked
    needs_end: bool = False  # a log cut with requests in flight cannot decide it
    counts: dict[str, tuple[Selector, ...]] = field(default_factory=dict)
    sums: dict[str, Sum] = field(default_factory=dict)
    let: dict[str, expr.Expr] = field(default_factory=dict)
    check: expr.Expr | None = None
    numerator: expr.Expr | None = None
    denominator: expr.Expr | None = None
    at_least: float | None = None
    at_most: float | None = None
    name: str = ""  # the ratio's name in its sentence
    control_engaged: str | None = None
    fields: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class Regime:
    description: str
    applies: tuple[Selector, ...]
    min_ranks: int = 1  # ranks writing receipts; 0 for a window over foreign (text) logs
    recipe: Recipe | None = None  # how `engine window` reaches the regime (audit.recipe)


@dataclass(slots=True, frozen=True)
class Spec:
    name: str
    path: Path
    description: str
    regime: Regime
    claims: tuple[Claim, ...]
    events: tuple[TextEvent, ...] = ()  # the text events its claims may select
