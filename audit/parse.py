"""Parsing ``spec.toml`` into the model of ``audit.model``: the spec, its text events, its
regime and the common part of its claims; each kind's own keys are parsed by its module, found in
the registry (``audit.kinds.KINDS``). What a selector may name, and the checks of every name against
the schema and the spec's text events, are in ``audit.parse_select``. A kind, field, key or
operator nothing knows is a ``SpecError`` (sysexits 64), never a selector that silently matches
nothing.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from audit import kinds
from audit.model import Claim, Regime, Spec
from audit.parse_select import NO_EVENTS, Events, SpecError, err, keys, parse_events, selectors
from audit.recipe import RecipeError, parse_recipe
from engine.observability import schema

RECIPE_KEYS = ("engine", "load", "control", "boots")  # [regime.*] tables: audit.recipe

__all__ = ["SpecError", "parse_claim", "parse_spec", "selectors"]

_COMMON = {"id", "kind", "description", "requires", "allow_vacuous", "applies"}


def parse_claim(t: dict[str, Any], where: str, events: Events = NO_EVENTS) -> Claim:
    """One ``[[claim]]``, as its kind's own claim (``audit.kinds``); ``events``: the spec's text
    events its selectors may name."""
    if not isinstance(t, dict):
        raise err(where, "a claim is a table")
    cid, kind = t.get("id"), t.get("kind")
    if not isinstance(cid, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", cid):
        raise err(where, f"claim id {cid!r} must be lower_snake_case")
    where = f"{where} ({cid})"
    known = kinds.KINDS  # read at each call: the registry is the one place a kind is known
    if kind not in known:
        raise err(where, f"unknown claim kind {kind!r} (one of {', '.join(known)})")
    keys(t, _COMMON | known[kind].keys, where)
    requires = (
        selectors(t["requires"], f"{where} requires", events=events) if "requires" in t else ()
    )
    applies = selectors(t["applies"], f"{where} applies", events=events) if "applies" in t else ()
    description, vacuous = str(t.get("description", "")), bool(t.get("allow_vacuous", False))
    head = Claim(
        id=cid,
        kind=kind,
        description=description,
        requires=requires,
        allow_vacuous=vacuous,
        applies=applies,
    )
    return known[kind].parse(t, where, head, events)


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
