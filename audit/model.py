"""What a spec is once parsed: selectors (which receipts or lines a claim reads), the common part
of every claim (each kind's own parameters are in its module, ``audit.kinds``), the regime a
window applies to, and the spec that holds them. Plain frozen values; ``audit.parse``
builds them from TOML and checks every name against the schema.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from audit.recipe import Recipe

# the operators a field predicate may use (``Pred.test`` knows each one)
OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not_in", "regex", "exists")
_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _test(name: str, op: str, value: Any) -> Callable[[dict[str, Any]], bool]:
    """Whether a record's field ``name`` passes ``op value``: a missing field is None; an order
    holds only for a number that is not a bool."""
    if op == "exists":
        want = bool(value)
        return lambda rec: (rec.get(name) is not None) == want
    if op == "==":
        return lambda rec: rec.get(name) == value
    if op == "!=":
        return lambda rec: rec.get(name) != value
    if op == "in":
        return lambda rec: rec.get(name) in value
    if op == "not_in":
        return lambda rec: rec.get(name) not in value
    if op == "regex":
        return lambda rec: isinstance(v := rec.get(name), str) and value.fullmatch(v) is not None
    if op not in _ORDER:
        raise ValueError(f"unknown operator {op!r}")
    order = _ORDER[op]

    def ordered(rec: dict[str, Any]) -> bool:
        v = rec.get(name)
        return type(v) is not bool and isinstance(v, int | float) and order(v, value)

    return ordered


def _all(where: tuple[Pred, ...]) -> Callable[[dict[str, Any]], bool]:
    if len(where) == 1:
        return where[0].test
    tests = tuple(p.test for p in where)

    def every(rec: dict[str, Any]) -> bool:
        for t in tests:  # a loop, not all() of a generator: a call per receipt read
            if not t(rec):
                return False
        return True

    return every


@dataclass(slots=True, frozen=True)
class Pred:
    field: str
    op: str
    value: Any
    # ``test(rec)``: whether the record's field passes, made once for the operator (a call per
    # receipt read: no operator is looked up per receipt)
    test: Callable[[dict[str, Any]], bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "test", _test(self.field, self.op, self.value))

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
    # ``matches(rec)``: whether the record passes every ``where`` (a call per receipt read: one
    # predicate's test is called as it is)
    matches: Callable[[dict[str, Any]], bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "matches", _all(self.where))

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
