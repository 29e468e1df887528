"""The rules a knob's value must meet, each a predicate over the value (``_need`` says which
knob broke which rule, with the value it got). EngineConfig's sections apply them."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def _knob(default: Any, text: str) -> Any:
    """A field with its default and its help text, the one place both are declared."""
    return field(default=default, metadata={"help": text})


class _Section:
    """A section checks its own fields when built (``validate``); a rule that reads another
    section's field is EngineConfig's (``_check_across``)."""

    __slots__ = ()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        raise NotImplementedError


def need(ok: bool, section: object, name: str, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {getattr(section, name)!r}")


def is_int(v: Any, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def int_or_none(v: Any, low: int) -> bool:
    return v is None or is_int(v, low)


def per_rank(v: Any, tp: int) -> bool:
    """One pool size per rank, each an integer >= 1."""
    if not isinstance(v, (list, tuple)) or len(v) != tp or tp < 2:
        return False
    return all(is_int(x, 1) for x in v)


def http_url(v: Any) -> bool:
    from urllib.parse import urlsplit

    if not isinstance(v, str):
        return False
    try:
        u = urlsplit(v)
        u.port  # noqa: B018 (raises on a malformed port)
    except ValueError:
        return False
    return u.scheme in ("http", "https") and bool(u.hostname)


def entries(v: Any, valid: Any) -> bool:
    """A tuple of strings, each ``*`` or one ``valid`` parses (``netloc.parse_host``...)."""
    if not isinstance(v, tuple):
        return False
    return all(isinstance(x, str) and (x == "*" or valid(x) is not None) for x in v)


def seconds(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")
