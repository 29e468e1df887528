"""Parsing ``spec.toml`` into the model of ``audit.model``, checking every name against the schema.

Selectors are scoped, never free text: a receipt selector names a kind from the catalog and
predicates on fields that kind carries; a text selector binds a regex to one named source
(``text``: plain lines, ``json``: foreign JSON lines) and must match the *whole* line; a signal
selector names a derived signal (``wedge``). A kind, field, source, key or operator the schema
does not know is a ``SpecError`` (sysexits 64), never a selector that silently matches nothing.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from audit import expr
from audit.model import (
    CLAIM_KINDS,
    OPS,
    Claim,
    Pred,
    ReceiptSel,
    Regime,
    Selector,
    Spec,
    Sum,
    TextSel,
    WedgeSel,
)
from audit.reader import SOURCES
from engine.obs import schema


class SpecError(ValueError):
    """A spec that cannot be evaluated as written (sysexits 64)."""


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
        if op not in OPS:
            raise _err(where, f"field {fname!r}: unknown operator {op!r} (one of {', '.join(OPS)})")
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


# the kinds whose claim reads one 'select'
_SELECTING = ("engaged", "never", "invariant", "ranks_agree")


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
    if kind in _SELECTING:
        if "select" not in t:
            raise _err(where, "needs 'select'")
        args["select"] = selectors(t["select"], f"{where} select", receipts_only=kind != "never")
    args.update(_KIND_ARGS[kind](t, where, args))
    return Claim(**args)


# Each kind's own fields: (claim table, where, the common args parsed so far) -> more args.


def _engaged(t: dict[str, Any], where: str, args: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(t.get("min", 1), int) or t.get("min", 1) < 1:
        raise _err(where, "'min' is an integer >= 1")
    return {"min": t.get("min", 1)}


def _never(t: dict[str, Any], where: str, args: dict[str, Any]) -> dict[str, Any]:
    if not args.get("requires"):
        raise _err(where, "a 'never' claim needs 'requires': what shows the log was observed")
    return {}


def _every(t: dict[str, Any], where: str, args: dict[str, Any]) -> dict[str, Any]:
    if "when" not in t or "then" not in t:
        raise _err(where, "needs 'when' and 'then'")
    when = selectors(t["when"], f"{where} when", receipts_only=True)
    then = selectors(t["then"], f"{where} then", receipts_only=True)
    when_key = t.get("when_key", t.get("key", "rid"))
    then_key = t.get("then_key", t.get("key", "rid"))
    for s in when:
        _field(s.kind, when_key, f"{where} when_key")
    for s in then:
        _field(s.kind, then_key, f"{where} then_key")
    return {"when": when, "then": then, "when_key": when_key, "then_key": then_key}


def _derived(t: dict[str, Any], where: str, args: dict[str, Any]) -> dict[str, Any]:
    """ratio, compare and control: counts and sums, derived numbers, then the kind's test."""
    kind = args["kind"]
    nums = _numbers(t, where, control=kind == "control")
    names = nums.pop("names")
    if kind == "ratio":
        return nums | _ratio(t, where, names, args["id"])
    return nums | _checked(t, where, names, nums, control=kind == "control")


def _ratio(t: dict[str, Any], where: str, names: set[str], cid: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in ("numerator", "denominator"):
        if k not in t:
            raise _err(where, f"needs '{k}'")
        out[k] = _expr(t[k], f"{where} {k}", names, comparison=False)
    for k, a in (("min", "at_least"), ("max", "at_most")):
        if k in t:
            if not isinstance(t[k], int | float) or isinstance(t[k], bool):
                raise _err(where, f"'{k}' is a number")
            out[a] = float(t[k])
    if out.get("at_least") is None and out.get("at_most") is None:
        raise _err(where, "a ratio needs 'min' or 'max'")
    out["name"] = str(t.get("name", cid))
    return out


def _checked(
    t: dict[str, Any], where: str, names: set[str], nums: dict[str, Any], *, control: bool
) -> dict[str, Any]:
    """compare and control: a comparison over the numbers (and, for control, the control's)."""
    if "check" not in t:
        raise _err(where, "needs 'check'")
    out = {"check": _expr(t["check"], f"{where} check", names, comparison=True)}
    if control:
        eng = t.get("control_engaged")
        if eng not in nums["counts"] and eng not in nums["sums"] and eng is not None:
            raise _err(where, f"control_engaged {eng!r} is not a count or sum here")
        out["control_engaged"] = eng
    return out


def _invariant(t: dict[str, Any], where: str, args: dict[str, Any]) -> dict[str, Any]:
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
    return {"check": _expr(t["check"], f"{where} check", allowed, comparison=True)}


def _ranks_agree(t: dict[str, Any], where: str, args: dict[str, Any]) -> dict[str, Any]:
    fields = t.get("fields", ["rid"])
    if not isinstance(fields, list) or not fields:
        raise _err(where, "'fields' is a non-empty list of field names")
    for s in args["select"]:
        for f in fields:
            _field(s.kind, f, f"{where} fields")
    return {"fields": tuple(fields)}


_KIND_ARGS: dict[str, Callable[[dict[str, Any], str, dict[str, Any]], dict[str, Any]]] = {
    "engaged": _engaged,
    "never": _never,
    "every": _every,
    "ratio": _derived,
    "compare": _derived,
    "control": _derived,
    "invariant": _invariant,
    "ranks_agree": _ranks_agree,
}


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
