"""What a request's output must match (a ``Guide``), checked where the request comes in.

Torch-free and xgrammar-free: the HTTP process builds guides and refuses what cannot be honoured
before anything reaches the scheduler. A JSON schema is checked against the JSON Schema
2020-12 meta-schema (``jsonschema_rs``), and refused when it uses an assertion keyword the grammar
cannot enforce: xgrammar compiles such a schema without a word and then lets through output the
schema forbids (``uniqueItems``, ``not``, ``if``/``then``, ...; each one is pinned by a test that
shows xgrammar ignoring it), and a guide that silently does not guide answers a different question.

What a guide may hold is bounded (``MAX_GUIDE_BYTES``), measured on its JSON text before anything
else reads it: the checks' cost grows with the schema, and the server runs them off its event
loop within a deadline, so the bound is what keeps their worst case short (BENCHMARKS.md). The
meta-schema check is ``jsonschema_rs`` (Rust) rather than ``jsonschema``: a 0.71 MB schema of
10,000 properties took ``jsonschema`` 2.5 s on this machine (85,000 empty subschemas: 29 s), and
``jsonschema_rs`` under 30 ms at 1 MB.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson

KINDS = ("json_object", "json_schema", "regex", "choice", "grammar", "tagged_json", "alternation")
JSON_KINDS = ("json_object", "json_schema")
# The most a schema, a regex, a grammar or a list of choices may hold, as JSON text (a regex or
# grammar: its UTF-8 bytes); a chat's tools together too. The checks of a schema of this size
# take at most about 0.3 s here, in the worst shape measured (110,000 empty subschemas; bench/
# schema_in_flight.py, BENCHMARKS.md), and a plain 1 MB schema of 14,000 properties 0.05 s.
MAX_GUIDE_BYTES = 1 << 20

# Assertion keywords xgrammar 0.2 compiles but does not enforce (tests/unit/test_grammar_compiler.py
# shows each one ignored). Annotations (title, description, default, examples, ...) and unknown
# keywords are ignored by JSON Schema itself and stay allowed.
UNENFORCED = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
        "$recursiveRef",
    }
)
# Where a schema holds schemas: one, a list of them, or a map of names to them.
_ONE = ("additionalProperties", "items", "propertyNames", "additionalItems")
_LIST = ("prefixItems", "anyOf", "oneOf", "allOf")
_MAP = ("properties", "patternProperties", "$defs", "definitions")


class GuideError(ValueError):
    """A guide that cannot be honoured: the message says why, ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Guide:
    """What the output must match. ``spec``: the schema as canonical JSON text (json_schema),
    the pattern (regex), the choices as a JSON list (choice), the EBNF (grammar), the guides it
    allows any one of as a JSON list of ``[kind, spec, strict]`` (alternation); empty for
    json_object. ``strict``: a json_schema's objects take no property the schema does not name
    (OpenAI's ``strict``), else JSON Schema's default (any other property is allowed)."""

    kind: str
    spec: str = ""
    strict: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"guide kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def digest(self) -> str:
        """16 hex digits naming the guide in receipts and spans (the schema is not logged)."""
        text = f"{self.kind}\0{int(self.strict)}\0{self.spec}".encode()
        return hashlib.sha256(text).hexdigest()[:16]

    @property
    def parts(self) -> tuple[Guide, ...]:
        """The guides an alternation allows any one of; a guide of another kind is its own."""
        if self.kind != "alternation":
            return (self,)
        return tuple(Guide(k, spec, strict) for k, spec, strict in orjson.loads(self.spec))

    @property
    def json_only(self) -> bool:
        """Whether every output it allows is JSON (no control character outside a string)."""
        return all(p.kind in JSON_KINDS for p in self.parts)


def alternation(*guides: Guide) -> Guide:
    """A guide the output matches when it matches any one of ``guides`` (an alternation's own
    parts are taken in its place: one level)."""
    parts = [p for g in guides for p in g.parts]
    return Guide("alternation", orjson.dumps([[p.kind, p.spec, p.strict] for p in parts]).decode())


def bounded(text: bytes | str, param: str, what: str) -> None:
    """A GuideError naming the bound when ``text`` (JSON text, or a regex or grammar) holds more
    than ``MAX_GUIDE_BYTES``."""
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_GUIDE_BYTES:
        raise GuideError(
            f"{param}: the {what} is {size} bytes; this server takes at most {MAX_GUIDE_BYTES} "
            f"bytes ({MAX_GUIDE_BYTES >> 20} MiB) of {what}",
            param,
        )


@cache
def _meta_validator() -> Any:
    """The 2020-12 meta-schema as a validator, built once (whatever ``$schema`` a schema names,
    as the grammar reads every schema alike)."""
    import jsonschema_rs
    from jsonschema import Draft202012Validator

    return jsonschema_rs.Draft202012Validator(Draft202012Validator.META_SCHEMA)


def json_schema_guide(schema: Any, strict: bool, param: str) -> Guide:
    """A json_schema guide, or a GuideError naming the place in ``param``'s schema that is
    too large, invalid or asks for what the grammar cannot enforce."""
    if not isinstance(schema, dict):
        raise GuideError(f"{param} must be a JSON object (a JSON schema)", param)
    text = orjson.dumps(schema)  # the key order is the schema's: it orders the output
    bounded(text, param, "JSON schema")
    import jsonschema_rs

    try:
        _meta_validator().validate(schema)
    except jsonschema_rs.ValidationError as e:
        where = ".".join([param, *map(str, e.instance_path)])
        raise GuideError(f"{where}: not a valid JSON schema: {e.message}", where) from None
    if _MARKS.search(text) is not None:  # most schemas name none of them: no walk
        _check_keywords(schema, param)
    return Guide("json_schema", text.decode(), strict)


# A key the walk refuses or reads, as it appears in the schema's JSON text.
_MARKS = re.compile(
    rb'"(?:' + b"|".join(re.escape(k.encode()) for k in (*UNENFORCED, "allOf", "$ref")) + rb')":'
)


def _check_keywords(schema: dict[str, Any], param: str) -> None:
    """A GuideError naming the first subschema that asks for what the grammar cannot hold."""
    for path, node in subschemas(schema, param):
        found = sorted(UNENFORCED & node.keys())
        if found:
            raise GuideError(
                f"{path}.{found[0]}: the JSON schema keyword {found[0]!r} is not supported "
                "(output could not be held to it)",
                f"{path}.{found[0]}",
            )
        if len(node.get("allOf", ())) > 1:
            raise GuideError(
                f"{path}.allOf: allOf with more than one schema is not supported; merge them",
                f"{path}.allOf",
            )
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            raise GuideError(
                f"{path}.$ref: only references inside the schema (#/...) are supported, got "
                f"{ref!r}",
                f"{path}.$ref",
            )


def subschemas(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema inside ``node`` (itself first) with its path; data (enum, const, default,
    examples) and property names are never read as keywords."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key in _ONE:
        yield from subschemas(node.get(key), f"{path}.{key}")
    for key in _LIST:
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield from subschemas(sub, f"{path}.{key}.{i}")
    for key in _MAP:
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield from subschemas(sub, f"{path}.{key}.{name}")


def choice_guide(choices: Any, param: str) -> Guide:
    """The output is exactly one of ``choices`` (non-empty strings)."""
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise GuideError(f"{param} must be a non-empty list of non-empty strings", param)
    text = orjson.dumps(choices)
    bounded(text, param, "choices")
    return Guide("choice", text.decode())


def text_guide(kind: str, text: Any, param: str) -> Guide:
    """A regex or grammar (EBNF) guide: a non-empty string; whether it compiles is the
    compiler's to say."""
    if not isinstance(text, str) or not text:
        raise GuideError(f"{param} must be a non-empty string", param)
    bounded(text, param, kind)
    return Guide(kind, text)
