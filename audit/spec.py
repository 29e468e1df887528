"""Acceptance specs: ``acceptance/<window>/spec.toml`` parsed and checked against the schema.

Selectors are scoped, never free text: a receipt selector names a kind from the catalog and
predicates on fields that kind carries; a text selector binds a regex to one named source
(``text``: plain lines, ``json``: foreign JSON lines) and must match the *whole* line; a signal
selector names a derived signal (``wedge``). A kind, field, source, key or operator the schema
does not know is a ``SpecError`` (sysexits 64), never a selector that silently matches nothing.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit import expr
from audit.reader import SOURCES
from engine.obs import schema

CLAIM_KINDS = (
    "engaged",
    "never",
    "every",
    "ratio",
    "compare",
    "control",
    "invariant",
    "ranks_agree",
)
# the claim kinds that can reach FAIL (an `engaged` claim is PASS or UNDECIDED by design: a signal
# that never appeared is not a decided negative)
CAN_FAIL = frozenset(CLAIM_KINDS) - {"engaged"}
_OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not_in", "regex", "exists")


class SpecError(ValueError):
    """A spec that cannot be evaluated as written (sysexits 64)."""


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
class ReceiptSel:
    kind: str
    where: tuple[Pred, ...] = ()

    def matches(self, rec: dict[str, Any]) -> bool:
        return all(p.test(rec) for p in self.where)

    def describe(self) -> str:
        if not self.where:
            return self.kind
        return f"{self.kind}[{', '.join(p.describe() for p in self.where)}]"


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
    min_ranks: int = 1


@dataclass(slots=True, frozen=True)
class Spec:
    name: str
    path: Path
    description: str
    regime: Regime
    claims: tuple[Claim, ...]


# -- parsing ------------------------------------------------------------------------------------


def _err(where: str, msg: str) -> SpecError:
    return SpecError(f"{where}: {msg}")


def _keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise _err(
            where, f"unknown key(s) {', '.join(extra)} (allowed: {', '.join(sorted(allowed))})"
        )


def _field(kind: str, name: str, where: str) -> str:
    if not schema.known_field(kind, name):
        raise _err(where, f"receipt kind {kind!r} has no field {name!r} in the schema")
    return name


def _pred(kind: str, fname: str, spec: Any, where: str) -> list[Pred]:
    _field(kind, fname, where)
    if not isinstance(spec, dict):
        return [Pred(fname, "==", spec)]
    out = []
    for op, value in spec.items():
        if op not in _OPS:
            raise _err(
                where, f"field {fname!r}: unknown operator {op!r} (one of {', '.join(_OPS)})"
            )
        if op == "regex":
            try:
                value = re.compile(value)
            except (re.error, TypeError) as e:
                raise _err(where, f"field {fname!r}: bad regex: {e}") from None
        elif op in ("in", "not_in") and not isinstance(value, list):
            raise _err(where, f"field {fname!r}: {op} takes a list")
        elif op in ("<", "<=", ">", ">=") and (
            not isinstance(value, int | float) or isinstance(value, bool)
        ):
            raise _err(where, f"field {fname!r}: {op} takes a number")
        out.append(Pred(fname, op, value))
    return out


def _one_selector(t: Any, where: str, *, receipts_only: bool = False) -> Selector:
    if not isinstance(t, dict):
        raise _err(where, f"a selector is a table, got {t!r}")
    if "kind" in t:
        _keys(t, {"kind", "where"}, where)
        kind = t["kind"]
        if kind not in schema.CATALOG:
            raise _err(where, f"receipt kind {kind!r} is not in the schema")
        where_t = t.get("where", {})
        if not isinstance(where_t, dict):
            raise _err(where, "'where' is a table of field predicates")
        preds = [p for f, s in where_t.items() for p in _pred(kind, f, s, where)]
        return ReceiptSel(kind, tuple(preds))
    if receipts_only:
        raise _err(where, "this selector must name a receipt kind ('kind = ...')")
    if "source" in t:
        _keys(t, {"source", "regex"}, where)
        if t["source"] not in SOURCES:
            raise _err(where, f"unknown text source {t['source']!r} (one of {', '.join(SOURCES)})")
        if not isinstance(t.get("regex"), str) or not t["regex"]:
            raise _err(
                where, "a text selector needs a non-empty 'regex' (matched against the whole line)"
            )
        try:
            return TextSel(t["source"], re.compile(t["regex"]))
        except re.error as e:
            raise _err(where, f"bad regex: {e}") from None
    if "signal" in t:
        _keys(t, {"signal", "threshold_s"}, where)
        if t["signal"] != "wedge":
            raise _err(where, f"unknown signal {t['signal']!r} (known: wedge)")
        thr = t.get("threshold_s")
        if not isinstance(thr, int | float) or isinstance(thr, bool) or thr <= 0:
            raise _err(where, "signal 'wedge' needs threshold_s > 0 (seconds)")
        return WedgeSel(float(thr))
    raise _err(
        where, "a selector names a receipt 'kind', a text 'source' with a 'regex', or a 'signal'"
    )


def selectors(v: Any, where: str, *, receipts_only: bool = False) -> tuple[Any, ...]:
    items = v if isinstance(v, list) else [v]
    if not items:
        raise _err(where, "an empty selector list matches nothing")
    return tuple(_one_selector(t, where, receipts_only=receipts_only) for t in items)


def _expr(src: Any, where: str, names: set[str], comparison: bool | None) -> expr.Expr:
    if not isinstance(src, str):
        raise _err(where, f"expected an expression string, got {src!r}")
    try:
        e = expr.parse(src, comparison=comparison)
    except expr.ExprError as err:
        raise _err(where, str(err)) from None
    unknown = sorted(e.names - names)
    if unknown:
        raise _err(where, f"{src!r} names {', '.join(unknown)}, not defined here")
    return e


_COMMON = {"id", "kind", "description", "requires", "allow_vacuous"}
_KEYS = {
    "engaged": {"select", "min"},
    "never": {"select"},
    "every": {"when", "then", "key", "when_key", "then_key"},
    "ratio": {"count", "sum", "let", "numerator", "denominator", "min", "max", "name"},
    "compare": {"count", "sum", "let", "check"},
    "control": {"count", "sum", "let", "check", "control_engaged"},
    "invariant": {"select", "check"},
    "ranks_agree": {"select", "fields"},
}


def _numbers(t: dict[str, Any], where: str, control: bool) -> dict[str, Any]:
    counts = {n: selectors(s, f"{where} count.{n}") for n, s in t.get("count", {}).items()}
    sums = {}
    for n, s in t.get("sum", {}).items():
        if not isinstance(s, dict):
            raise _err(where, f"sum.{n} is a table with 'select' and 'field'")
        _keys(s, {"select", "field"}, f"{where} sum.{n}")
        sel = selectors(s.get("select"), f"{where} sum.{n}", receipts_only=True)
        for r in sel:
            _field(r.kind, s.get("field", ""), f"{where} sum.{n}")
        sums[n] = Sum(sel, s["field"])
    names = set(counts) | set(sums)
    if not names:
        raise _err(where, "needs at least one 'count' or 'sum'")
    if control:
        names |= {f"control.{n}" for n in names}
    let = {}
    for n, src in t.get("let", {}).items():
        let[n] = _expr(src, f"{where} let.{n}", names, comparison=False)
        names.add(n)
        if control:
            names.add(f"control.{n}")
    return {"counts": counts, "sums": sums, "let": let, "names": names}


def parse_claim(t: dict[str, Any], where: str) -> Claim:
    if not isinstance(t, dict):
        raise _err(where, "a claim is a table")
    cid, kind = t.get("id"), t.get("kind")
    if not isinstance(cid, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", cid):
        raise _err(where, f"claim id {cid!r} must be lower_snake_case")
    where = f"{where} ({cid})"
    if kind not in CLAIM_KINDS:
        raise _err(where, f"unknown claim kind {kind!r} (one of {', '.join(CLAIM_KINDS)})")
    _keys(t, _COMMON | _KEYS[kind], where)
    args: dict[str, Any] = {
        "id": cid,
        "kind": kind,
        "description": str(t.get("description", "")),
        "allow_vacuous": bool(t.get("allow_vacuous", False)),
    }
    if "requires" in t:
        args["requires"] = selectors(t["requires"], f"{where} requires")
    if kind in ("engaged", "never", "invariant", "ranks_agree"):
        if "select" not in t:
            raise _err(where, "needs 'select'")
        args["select"] = selectors(t["select"], f"{where} select", receipts_only=kind != "never")
    if kind == "engaged":
        if not isinstance(t.get("min", 1), int) or t.get("min", 1) < 1:
            raise _err(where, "'min' is an integer >= 1")
        args["min"] = t.get("min", 1)
    elif kind == "never":
        if not args.get("requires"):
            raise _err(where, "a 'never' claim needs 'requires': what shows the log was observed")
    elif kind == "every":
        if "when" not in t or "then" not in t:
            raise _err(where, "needs 'when' and 'then'")
        args["when"] = selectors(t["when"], f"{where} when", receipts_only=True)
        args["then"] = selectors(t["then"], f"{where} then", receipts_only=True)
        args["when_key"] = t.get("when_key", t.get("key", "rid"))
        args["then_key"] = t.get("then_key", t.get("key", "rid"))
        for s in args["when"]:
            _field(s.kind, args["when_key"], f"{where} when_key")
        for s in args["then"]:
            _field(s.kind, args["then_key"], f"{where} then_key")
    elif kind in ("ratio", "compare", "control"):
        nums = _numbers(t, where, control=kind == "control")
        names = nums.pop("names")
        args.update(nums)
        if kind == "ratio":
            for k in ("numerator", "denominator"):
                if k not in t:
                    raise _err(where, f"needs '{k}'")
                args[k] = _expr(t[k], f"{where} {k}", names, comparison=False)
            for k, a in (("min", "at_least"), ("max", "at_most")):
                if k in t:
                    if not isinstance(t[k], int | float) or isinstance(t[k], bool):
                        raise _err(where, f"'{k}' is a number")
                    args[a] = float(t[k])
            if args.get("at_least") is None and args.get("at_most") is None:
                raise _err(where, "a ratio needs 'min' or 'max'")
            args["name"] = str(t.get("name", cid))
        else:
            if "check" not in t:
                raise _err(where, "needs 'check'")
            args["check"] = _expr(t["check"], f"{where} check", names, comparison=True)
            if kind == "control":
                eng = t.get("control_engaged")
                if eng not in nums["counts"] and eng not in nums["sums"] and eng is not None:
                    raise _err(where, f"control_engaged {eng!r} is not a count or sum here")
                args["control_engaged"] = eng
    elif kind == "invariant":
        if "check" not in t:
            raise _err(where, "needs 'check'")
        # the check may name only fields every selected kind knows
        allowed = set.intersection(
            *(
                set(schema.COMMON_FIELDS)
                | set(schema.CATALOG[s.kind].fields)
                | set(schema.CATALOG[s.kind].optional)
                for s in args["select"]
            )
        )
        args["check"] = _expr(t["check"], f"{where} check", allowed, comparison=True)
    elif kind == "ranks_agree":
        fields = t.get("fields", ["rid"])
        if not isinstance(fields, list) or not fields:
            raise _err(where, "'fields' is a non-empty list of field names")
        for s in args["select"]:
            for f in fields:
                _field(s.kind, f, f"{where} fields")
        args["fields"] = tuple(fields)
    return Claim(**args)


def parse_spec(text: str, path: Path, name: str | None = None) -> Spec:
    where = str(path)
    try:
        t = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _err(where, f"not valid TOML: {e}") from None
    _keys(t, {"name", "description", "regime", "claim"}, where)
    regime_t = t.get("regime", {})
    if not isinstance(regime_t, dict):
        raise _err(where, "[regime] is a table")
    _keys(regime_t, {"description", "applies", "min_ranks"}, f"{where} [regime]")
    applies = selectors(regime_t.get("applies", {"kind": schema.BOOT_START}), f"{where} [regime]")
    min_ranks = regime_t.get("min_ranks", 1)
    if not isinstance(min_ranks, int) or min_ranks < 1:
        raise _err(where, "[regime] min_ranks is an integer >= 1")
    claims_t = t.get("claim")
    if not isinstance(claims_t, list) or not claims_t:
        raise _err(where, "a spec needs at least one [[claim]]")
    claims = tuple(parse_claim(c, f"{where} claim {i + 1}") for i, c in enumerate(claims_t))
    ids = [c.id for c in claims]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise _err(where, f"duplicate claim id(s): {', '.join(dup)}")
    return Spec(
        name=str(t.get("name", name or path.parent.name)),
        path=path,
        description=str(t.get("description", "")),
        regime=Regime(str(regime_t.get("description", "")), applies, min_ranks),
        claims=claims,
    )


def load_spec(path: str | Path) -> Spec:
    p = Path(path)
    if p.is_dir():
        p = p / "spec.toml"
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: cannot read spec: {e}") from None
    return parse_spec(text, p)


def acceptance_dir() -> Path:
    """Where the shipped windows live: $ATTEST_ACCEPTANCE, else the project's acceptance/."""
    env = os.environ.get("ATTEST_ACCEPTANCE")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "acceptance"


def shipped() -> list[Path]:
    root = acceptance_dir()
    return sorted(p.parent for p in root.glob("*/spec.toml"))


def resolve(name_or_path: str) -> Spec:
    """A shipped window by name, or a spec file or window folder by path."""
    p = Path(name_or_path)
    if p.exists():
        return load_spec(p)
    if re.fullmatch(r"[A-Za-z0-9_-]+", name_or_path):
        window = acceptance_dir() / name_or_path
        if (window / "spec.toml").exists():
            return load_spec(window)
    known = ", ".join(w.name for w in shipped()) or "none"
    raise SpecError(f"no spec {name_or_path!r}: not a file, and not a shipped window ({known})")
