"""What a spec is once parsed: selectors (which receipts or lines a claim reads), the common part
of every claim (each kind's own parameters are in its module, ``audit.kinds``), the regime a
window applies to, and the spec that holds them. Plain frozen values; ``audit.parse``
builds them from TOML and checks every name against the schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from audit.recipe import Recipe

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
    where given, names the loggers one of which the head must name (compared by module:
    'metrics.py' is the logger 'vllm.engine.metrics' too)."""

    name: str
    format: str
    pattern: re.Pattern[str]
    logger: tuple[str, ...] | None
    fields: frozenset[str]


@dataclass(slots=True, frozen=True)
class ReceiptSel:
    """Records of one kind: receipts of a catalog kind, or (``event`` set) the events a spec's
    text event makes of text lines. Either way, records with fields that ``where`` tests."""

    kind: str
    where: tuple[Pred, ...] = ()
    event: TextEvent | None = None

    def matches(self, rec: dict[str, Any]) -> bool:
        for p in self.where:  # a loop, not all() of a generator: a call per receipt read
            if not p.test(rec):
                return False
        return True

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


@dataclass(slots=True, frozen=True, kw_only=True)
class Claim:
    """What every claim has, whatever its kind. Each kind's own parameters are a subclass of this
    in the kind's module (``audit.kinds``); its ``kind`` names that module's ``ClaimKind``."""

    id: str
    kind: str
    description: str = ""
    requires: tuple[Selector, ...] = ()  # what shows the mechanism engaged
    allow_vacuous: bool = False
    # what the claim is about: where none of it is in a (complete) log, the claim is N/A
    applies: tuple[Selector, ...] = ()

    def common(self) -> dict[str, Any]:
        """The common part as keywords, for a kind's parser to build its own claim with."""
        return {f.name: getattr(self, f.name) for f in fields(Claim)}


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
