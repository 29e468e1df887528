"""What a spec's selectors may name, each name checked against what exists.

Selectors are scoped, never free text: a receipt selector names a kind from the catalog and
predicates on fields that kind carries; a text selector binds a regex to one named source
(``text``: plain lines, ``json``: foreign JSON lines) and must match the *whole* line; a signal
selector names a derived signal (``wedge``); an event selector names one of the spec's text
events. A text event (``[event.NAME]``) reads foreign engines' lines: ``prefix`` names the log
head the line must start with (one of ``audit.foreign.FORMATS``: SGLang's, vLLM's, uvicorn's),
``regex`` must match the rest of the line whole, and its named groups are the event's fields.
A kind, field, source, prefix, key or operator nothing knows is a ``SpecError`` (sysexits 64),
never a selector that silently matches nothing; so is a regex with named groups not scoped by a
prefix, whose fields an unrelated line carrying the same words could fill.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from audit.foreign import FORMATS, RESERVED
from audit.model import OPS, Pred, ReceiptSel, Selector, TextEvent, TextSel, WedgeSel
from audit.reader import SOURCES
from engine.observability import schema

Events = Mapping[str, TextEvent]  # a spec's text events by name
NO_EVENTS: Events = MappingProxyType({})
_TEXT_COMMON = frozenset({"event", "where"})  # what a text event carries besides its own fields


class SpecError(ValueError):
    """A spec that cannot be evaluated as written (sysexits 64)."""


def err(where: str, msg: str) -> SpecError:
    return SpecError(f"{where}: {msg}")


def keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise err(
            where, f"unknown key(s) {', '.join(extra)} (allowed: {', '.join(sorted(allowed))})"
        )


def known_fields(sel: ReceiptSel) -> frozenset[str]:
    """The fields a record ``sel`` selects may carry."""
    if sel.event is not None:
        return sel.event.fields | _TEXT_COMMON
    kind = schema.CATALOG[sel.kind]
    return frozenset(schema.COMMON_FIELDS) | set(kind.fields) | set(kind.optional)


def field(sel: ReceiptSel, name: str, where: str) -> str:
    if sel.event is not None:
        if name not in known_fields(sel):
            shown = ", ".join(sorted(sel.event.fields))
            raise err(where, f"text event {sel.kind!r} has no field {name!r} (its fields: {shown})")
    elif not schema.known_field(sel.kind, name):
        raise err(where, f"receipt kind {sel.kind!r} has no field {name!r} in the schema")
    return name


def _pred(fname: str, spec: Any, where: str) -> list[Pred]:
    if not isinstance(spec, dict):
        return [Pred(fname, "==", spec)]
    out = []
    for op, value in spec.items():
        if op not in OPS:
            raise err(where, f"field {fname!r}: unknown operator {op!r} (one of {', '.join(OPS)})")
        if op == "regex":
            try:
                value = re.compile(value)
            except (re.error, TypeError) as e:
                raise err(where, f"field {fname!r}: bad regex: {e}") from None
        elif op in ("in", "not_in") and not isinstance(value, list):
            raise err(where, f"field {fname!r}: {op} takes a list")
        elif op in ("<", "<=", ">", ">=") and (
            not isinstance(value, int | float) or isinstance(value, bool)
        ):
            raise err(where, f"field {fname!r}: {op} takes a number")
        out.append(Pred(fname, op, value))
    return out


def _records(t: dict[str, Any], where: str, events: Events) -> ReceiptSel:
    """``{ kind = ..., where = {...} }``: receipts of a catalog kind, or a text event's."""
    keys(t, {"kind", "where"}, where)
    kind = t["kind"]
    event = events.get(kind) if isinstance(kind, str) else None
    if event is None and kind not in schema.CATALOG:
        known = f" nor a text event of this spec ({', '.join(events)})" if events else ""
        raise err(where, f"receipt kind {kind!r} is not in the schema{known}")
    where_t = t.get("where", {})
    if not isinstance(where_t, dict):
        raise err(where, "'where' is a table of field predicates")
    sel = ReceiptSel(kind, event=event)
    preds = [p for f, s in where_t.items() for p in _pred(field(sel, f, where), s, where)]
    return ReceiptSel(kind, tuple(preds), event)


def _text(t: dict[str, Any], where: str) -> TextSel:
    keys(t, {"source", "regex"}, where)
    if t["source"] not in SOURCES:
        raise err(where, f"unknown text source {t['source']!r} (one of {', '.join(SOURCES)})")
    if not isinstance(t.get("regex"), str) or not t["regex"]:
        raise err(
            where, "a text selector needs a non-empty 'regex' (matched against the whole line)"
        )
    try:
        pattern = re.compile(t["regex"])
    except re.error as e:
        raise err(where, f"bad regex: {e}") from None
    if pattern.groupindex:
        raise err(
            where,
            f"named groups ({', '.join(pattern.groupindex)}) make fields only in a text event "
            "scoped by a log prefix: define [event.NAME] with 'prefix' and 'regex', and select "
            "{ kind = NAME }",
        )
    return TextSel(t["source"], pattern)


def _one_selector(t: Any, where: str, events: Events, receipts_only: bool) -> Selector:
    if not isinstance(t, dict):
        raise err(where, f"a selector is a table, got {t!r}")
    if "kind" in t:
        return _records(t, where, events)
    if receipts_only:
        raise err(where, "this selector must name a receipt kind or a text event ('kind = ...')")
    if "source" in t:
        return _text(t, where)
    if "signal" in t:
        keys(t, {"signal", "threshold_s"}, where)
        if t["signal"] != "wedge":
            raise err(where, f"unknown signal {t['signal']!r} (known: wedge)")
        thr = t.get("threshold_s")
        if not isinstance(thr, int | float) or isinstance(thr, bool) or thr <= 0:
            raise err(where, "signal 'wedge' needs threshold_s > 0 (seconds)")
        return WedgeSel(float(thr))
    raise err(
        where, "a selector names a receipt 'kind', a text 'source' with a 'regex', or a 'signal'"
    )


def selectors(
    v: Any, where: str, *, receipts_only: bool = False, events: Events = NO_EVENTS
) -> tuple[Any, ...]:
    items = v if isinstance(v, list) else [v]
    if not items:
        raise err(where, "an empty selector list matches nothing")
    return tuple(_one_selector(t, where, events, receipts_only) for t in items)


def one_stream(sels: tuple[ReceiptSel, ...], where: str) -> None:
    """Selectors whose records a claim orders against each other read receipts only, or text
    events only: a text line has no seq on any receipt's (boot, rank)."""
    if len({s.event is None for s in sels}) > 1:
        raise err(where, "mixes receipts and text events, which cannot be ordered together")


_EVENT_KEYS = {"prefix", "regex", "logger", "description"}


def parse_events(t: Any, where: str) -> dict[str, TextEvent]:
    """The spec's ``[event.NAME]`` tables."""
    if not isinstance(t, dict):
        raise err(where, "[event] is a table of text events ([event.NAME])")
    return {name: _event(name, e, f"{where} [event.{name}]") for name, e in t.items()}


def _event(name: str, t: Any, where: str) -> TextEvent:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise err(where, "a text event's name is lower_snake_case")
    if name in schema.CATALOG:
        raise err(where, f"{name!r} is a receipt kind: a text event needs a name of its own")
    if not isinstance(t, dict):
        raise err(where, "a text event is a table with 'prefix' and 'regex'")
    keys(t, _EVENT_KEYS, where)
    prefix = t.get("prefix")
    fmt = FORMATS.get(prefix) if isinstance(prefix, str) else None
    if fmt is None:
        raise err(
            where,
            f"needs 'prefix', the log head its lines start with (one of {', '.join(FORMATS)}; "
            f"got {prefix!r}): without it a line from anywhere carrying the same "
            "words would make the event",
        )
    logger = t.get("logger")
    if isinstance(logger, str):
        logger = [logger]
    if logger is not None and (
        not isinstance(logger, list)
        or not logger
        or not all(isinstance(x, str) and x for x in logger)
        or not fmt.logger
    ):
        raise err(
            where,
            "'logger' is a logger's name (or a list of them), and only a prefix that names one "
            f"has it ({fmt.name} does not)",
        )
    if not isinstance(t.get("regex"), str) or not t["regex"]:
        raise err(where, "needs a non-empty 'regex' (matched against the whole rest of the line)")
    try:
        pattern = re.compile(t["regex"])
    except re.error as e:
        raise err(where, f"bad regex: {e}") from None
    clash = sorted(set(pattern.groupindex) & (RESERVED | fmt.fields))
    if clash:
        raise err(
            where,
            f"group name(s) {', '.join(clash)} are taken (by every text event, or the {fmt.name} prefix)",
        )
    loggers = None if logger is None else tuple(logger)
    return TextEvent(name, fmt.name, pattern, loggers, fmt.fields | frozenset(pattern.groupindex))
