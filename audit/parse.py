"""Parsing ``spec.toml`` into the model of ``audit.model``: the spec, its text events, its
claims and each kind's own keys. What a selector may name, and the checks of every name against
the schema and the spec's text events, are in ``audit.parse_select``. A kind, field, key or
operator nothing knows is a ``SpecError`` (sysexits 64), never a selector that silently matches
nothing.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from audit import expr
from audit.model import CLAIM_KINDS, Claim, ReceiptSel, Regime, Spec, Sum
from audit.parse_select import (
    NO_EVENTS,
    Events,
    SpecError,
    err,
    field,
    keys,
    known_fields,
    one_stream,
    parse_events,
    selectors,
)
from audit.recipe import RecipeError, parse_recipe
from engine.obs import schema

RECIPE_KEYS = ("engine", "load", "control")  # [regime.*] tables: audit.recipe

__all__ = ["SpecError", "parse_claim", "parse_spec", "selectors"]


def _expr(src: Any, where: str, names: set[str], comparison: bool | None) -> expr.Expr:
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


_COMMON = {"id", "kind", "description", "requires", "allow_vacuous"}
_KEYS = {
    "engaged": {"select", "min"},
    "never": {"select", "needs_end"},
    "every": {"when", "then", "key", "when_key", "then_key", "closes", "close_key", "stops"},
    "ratio": {"count", "sum", "let", "numerator", "denominator", "min", "max", "name"},
    "compare": {"count", "sum", "let", "check"},
    "control": {"count", "sum", "let", "check", "control_engaged"},
    "invariant": {"select", "check"},
    "ranks_agree": {"select", "fields"},
    "final": {"select", "key", "check", "stops"},
}


def _numbers(t: dict[str, Any], where: str, control: bool, events: Events) -> dict[str, Any]:
    counts = {
        n: selectors(s, f"{where} count.{n}", events=events) for n, s in t.get("count", {}).items()
    }
    sums = {}
    for n, s in t.get("sum", {}).items():
        if not isinstance(s, dict):
            raise err(where, f"sum.{n} is a table with 'select' and 'field'")
        keys(s, {"select", "field"}, f"{where} sum.{n}")
        sel = selectors(s.get("select"), f"{where} sum.{n}", receipts_only=True, events=events)
        for r in sel:
            field(r, s.get("field", ""), f"{where} sum.{n}")
        sums[n] = Sum(sel, s["field"])
    names = set(counts) | set(sums)
    if not names:
        raise err(where, "needs at least one 'count' or 'sum'")
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
_SELECTING = ("engaged", "never", "invariant", "ranks_agree", "final")


def parse_claim(t: dict[str, Any], where: str, events: Events = NO_EVENTS) -> Claim:
    """One ``[[claim]]``; ``events``: the spec's text events its selectors may name."""
    if not isinstance(t, dict):
        raise err(where, "a claim is a table")
    cid, kind = t.get("id"), t.get("kind")
    if not isinstance(cid, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", cid):
        raise err(where, f"claim id {cid!r} must be lower_snake_case")
    where = f"{where} ({cid})"
    if kind not in CLAIM_KINDS:
        raise err(where, f"unknown claim kind {kind!r} (one of {', '.join(CLAIM_KINDS)})")
    keys(t, _COMMON | _KEYS[kind], where)
    args: dict[str, Any] = {
        "id": cid,
        "kind": kind,
        "description": str(t.get("description", "")),
        "allow_vacuous": bool(t.get("allow_vacuous", False)),
    }
    if "requires" in t:
        args["requires"] = selectors(t["requires"], f"{where} requires", events=events)
    if kind in _SELECTING:
        if "select" not in t:
            raise err(where, "needs 'select'")
        only = kind != "never"
        args["select"] = selectors(
            t["select"], f"{where} select", receipts_only=only, events=events
        )
    args.update(_KIND_ARGS[kind](t, where, args, events))
    return Claim(**args)


# Each kind's own fields: (claim table, where, the common args parsed so far, the spec's text
# events) -> more args.


def _engaged(t: dict[str, Any], where: str, args: dict[str, Any], events: Events) -> dict[str, Any]:
    if not isinstance(t.get("min", 1), int) or t.get("min", 1) < 1:
        raise err(where, "'min' is an integer >= 1")
    return {"min": t.get("min", 1)}


def _never(t: dict[str, Any], where: str, args: dict[str, Any], events: Events) -> dict[str, Any]:
    if not args.get("requires"):
        raise err(where, "a 'never' claim needs 'requires': what shows the log was observed")
    needs_end = t.get("needs_end", False)
    if not isinstance(needs_end, bool):
        raise err(where, "needs_end is true or false")
    return {"needs_end": needs_end}


def _every(t: dict[str, Any], where: str, args: dict[str, Any], events: Events) -> dict[str, Any]:
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
    out = {"when": when, "then": then, "when_key": when_key, "then_key": then_key}
    receipts = all(s.event is None for s in when)
    out |= _closes(t, where, when_key, receipts, events) | _stops(t, where, events)
    one_stream((*when, *then, *out["closes"], *out["stops"]), where)
    return out


# where a request's life ends: the default close of an `every` claim keyed on requests
_REQUEST_ENDS = (schema.REQUEST_FINISH, schema.REQUEST_ABORT, schema.REQUEST_REJECT)


def _closes(
    t: dict[str, Any], where: str, when_key: str, receipts: bool, events: Events
) -> dict[str, Any]:
    """The records that close a key's window. A request key (``rid``, ``rids``) of receipts
    closes at the request's ending unless the spec names others (``closes = []``: only boot.stop
    closes); a text event's key has no default close."""
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
    return {"closes": closes, "close_key": close_key}


def _stops(t: dict[str, Any], where: str, events: Events) -> dict[str, Any]:
    """Records that end the run, as boot.stop ends its rank's (a server's shutdown line)."""
    if "stops" not in t:
        return {"stops": ()}
    return {"stops": selectors(t["stops"], f"{where} stops", receipts_only=True, events=events)}


def _derived(t: dict[str, Any], where: str, args: dict[str, Any], events: Events) -> dict[str, Any]:
    """ratio, compare and control: counts and sums, derived numbers, then the kind's test."""
    kind = args["kind"]
    nums = _numbers(t, where, kind == "control", events)
    names = nums.pop("names")
    if kind == "ratio":
        return nums | _ratio(t, where, names, args["id"])
    return nums | _checked(t, where, names, nums, control=kind == "control")


def _ratio(t: dict[str, Any], where: str, names: set[str], cid: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in ("numerator", "denominator"):
        if k not in t:
            raise err(where, f"needs '{k}'")
        out[k] = _expr(t[k], f"{where} {k}", names, comparison=False)
    for k, a in (("min", "at_least"), ("max", "at_most")):
        if k in t:
            if not isinstance(t[k], int | float) or isinstance(t[k], bool):
                raise err(where, f"'{k}' is a number")
            out[a] = float(t[k])
    if out.get("at_least") is None and out.get("at_most") is None:
        raise err(where, "a ratio needs 'min' or 'max'")
    out["name"] = str(t.get("name", cid))
    return out


def _checked(
    t: dict[str, Any], where: str, names: set[str], nums: dict[str, Any], *, control: bool
) -> dict[str, Any]:
    """compare and control: a comparison over the numbers (and, for control, the control's)."""
    if "check" not in t:
        raise err(where, "needs 'check'")
    out = {"check": _expr(t["check"], f"{where} check", names, comparison=True)}
    if control:
        eng = t.get("control_engaged")
        if eng not in nums["counts"] and eng not in nums["sums"] and eng is not None:
            raise err(where, f"control_engaged {eng!r} is not a count or sum here")
        out["control_engaged"] = eng
    return out


def _record_check(t: dict[str, Any], where: str, sels: tuple[ReceiptSel, ...]) -> expr.Expr:
    """A comparison over one record's fields: only fields every selected kind knows."""
    if "check" not in t:
        raise err(where, "needs 'check'")
    allowed = set.intersection(*(set(known_fields(s)) for s in sels))
    return _expr(t["check"], f"{where} check", allowed, comparison=True)


def _invariant(
    t: dict[str, Any], where: str, args: dict[str, Any], events: Events
) -> dict[str, Any]:
    return {"check": _record_check(t, where, args["select"])}


def _ranks_agree(
    t: dict[str, Any], where: str, args: dict[str, Any], events: Events
) -> dict[str, Any]:
    fields = t.get("fields", ["rid"])
    if not isinstance(fields, list) or not fields:
        raise err(where, "'fields' is a non-empty list of field names")
    for s in args["select"]:
        if s.event is not None:
            raise err(
                where,
                f"{s.kind!r} is a text event: ranks agree per iteration, which only receipts carry",
            )
        for f in fields:
            field(s, f, f"{where} fields")
    return {"fields": tuple(fields)}


def _final(t: dict[str, Any], where: str, args: dict[str, Any], events: Events) -> dict[str, Any]:
    key = t.get("key")
    if key is not None:  # a field some selected kind carries; the records without it share one key
        if not isinstance(key, str):
            raise err(where, "'key' is a field name")
        if not any(key in known_fields(s) for s in args["select"]):
            field(args["select"][0], key, f"{where} key")
    out = {"key": key, "check": _record_check(t, where, args["select"])}
    out |= _stops(t, where, events)
    one_stream((*args["select"], *out["stops"]), where)
    return out


_KindArgs = Callable[[dict[str, Any], str, dict[str, Any], Events], dict[str, Any]]
_KIND_ARGS: dict[str, _KindArgs] = {
    "engaged": _engaged,
    "never": _never,
    "every": _every,
    "ratio": _derived,
    "compare": _derived,
    "control": _derived,
    "invariant": _invariant,
    "ranks_agree": _ranks_agree,
    "final": _final,
}


def _regime(t: dict[str, Any], where: str, events: Events) -> Regime:
    regime_t = t.get("regime", {})
    if not isinstance(regime_t, dict):
        raise err(where, "[regime] is a table")
    keys(regime_t, {"description", "applies", "min_ranks", *RECIPE_KEYS}, f"{where} [regime]")
    applies = selectors(
        regime_t.get("applies", {"kind": schema.BOOT_START}), f"{where} [regime]", events=events
    )
    min_ranks = regime_t.get("min_ranks", 1)
    if not isinstance(min_ranks, int) or isinstance(min_ranks, bool) or min_ranks < 0:
        raise err(where, "[regime] min_ranks is an integer >= 0 (0: a window over text logs)")
    try:
        recipe = parse_recipe(regime_t, where)
    except RecipeError as e:
        raise err(where, str(e)) from None
    return Regime(str(regime_t.get("description", "")), applies, min_ranks, recipe)


def parse_spec(text: str, path: Path, name: str | None = None) -> Spec:
    where = str(path)
    try:
        t = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise err(where, f"not valid TOML: {e}") from None
    keys(t, {"name", "description", "regime", "event", "claim"}, where)
    events = parse_events(t.get("event", {}), where)
    regime = _regime(t, where, events)
    claims_t = t.get("claim")
    if not isinstance(claims_t, list) or not claims_t:
        raise err(where, "a spec needs at least one [[claim]]")
    claims = tuple(parse_claim(c, f"{where} claim {i + 1}", events) for i, c in enumerate(claims_t))
    ids = [c.id for c in claims]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise err(where, f"duplicate claim id(s): {', '.join(dup)}")
    return Spec(
        name=str(t.get("name", name or path.parent.name)),
        path=path,
        description=str(t.get("description", "")),
        regime=regime,
        claims=claims,
        events=tuple(events.values()),
    )
