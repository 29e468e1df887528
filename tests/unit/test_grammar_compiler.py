"""The grammars of an engine over a tiny byte-level vocabulary: compiled once and cached by the
guide, a guide that does not compile remembered within the cache's bound (the server's compiles
in worker processes are tests/integration/test_grammar_workers.py's). And the two
xgrammar 0.2.9 behaviours the engine works around, pinned so an upgrade that changes them says
so: the JSON Schema keywords it compiles but does not enforce (engine/request/guide.py refuses them),
and a length-bounded string that lets a raw control byte through (JSON guides ban those
tokens)."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from engine.guided.build import token_info
from engine.guided.compiler import Grammars
from engine.model.tokenizer import Tokenizer
from engine.observability.receipts import Receipts
from engine.request.guide import UNENFORCED, Guide, json_schema_guide, text_guide
from tests.tiny_model import EOS, VOCAB, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(
        train_tokenizer(), bos_id=0, eos_id=EOS, stop_ids={EOS}, add_bos=False, chat_template=None
    )


@pytest.fixture
def grammars(tokenizer):
    return Grammars(tokenizer, VOCAB, Receipts(capture=True), timeout_s=30.0)


def compiles(grammars, tokens: str, schema: dict) -> bool:
    """Whether ``tokens`` is a complete sentence of the schema's grammar, as xgrammar holds it."""
    g = grammars.compiled(Guide("json_schema", json.dumps(schema)))
    m = xgr.GrammarMatcher(g)
    return m.accept_string(tokens) and m.is_completed()


# keyword -> (schema, an instance it forbids)
IGNORED = {
    "not": ({"not": {"type": "string"}}, '"x"'),
    "if": ({"type": "string", "if": {"const": "x"}, "then": {"minLength": 3}}, '"x"'),
    "dependentRequired": ({"type": "object", "dependentRequired": {"a": ["b"]}}, '{"a": 1}'),
    "dependentSchemas": (
        {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}},
        '{"a": 1}',
    ),
    "uniqueItems": ({"type": "array", "uniqueItems": True}, "[1, 1]"),
    "contains": ({"type": "array", "contains": {"type": "string"}}, "[1]"),
    "unevaluatedProperties": (
        {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False},
        '{"b": 1}',
    ),
}


@pytest.mark.parametrize("keyword", sorted(IGNORED))
def test_xgrammar_compiles_these_keywords_and_lets_through_what_they_forbid(grammars, keyword):
    assert keyword in UNENFORCED
    schema, forbidden = IGNORED[keyword]
    assert compiles(grammars, forbidden, schema)  # so engine/request/guide.py refuses the keyword


def test_xgrammar_holds_the_keywords_the_guide_lets_through(grammars):
    held = {
        "minimum": ({"type": "integer", "minimum": 5}, "3"),
        "maxLength": ({"type": "string", "maxLength": 2}, '"abc"'),
        "pattern": ({"type": "string", "pattern": "^[0-9]+$"}, '"ab"'),
        "enum": ({"enum": ["a", 1]}, '"b"'),
        "required": ({"type": "object", "properties": {"a": {}}, "required": ["a"]}, "{}"),
        "additionalProperties": (
            {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
            '{"b": 1}',
        ),
        "maxItems": ({"type": "array", "maxItems": 1}, "[1, 2]"),
        "anyOf": ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "true"),
        "$ref": ({"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x"}, '"a"'),
    }
    for keyword, (schema, forbidden) in held.items():
        assert not compiles(grammars, forbidden, schema), keyword


def test_a_bounded_string_lets_a_control_byte_through_and_json_guides_ban_it(grammars):
    schema = {"type": "string", "maxLength": 8}
    assert compiles(grammars, '"\x14"', schema)  # xgrammar 0.2.9's bounded-string rule
    assert not compiles(grammars, '"\x14"', {"type": "string"})  # the unbounded one is right
    info = token_info(grammars.tokenizer, VOCAB)
    controls = {i for i, b in enumerate(info.decoded_vocab) if any(c < 0x20 for c in b)}
    assert controls  # the byte-level vocabulary has them
    guided = grammars.guided(json_schema_guide(schema, False, "s"))
    assert set(guided.banned.tolist()) == controls - {EOS}
    assert grammars.guided(text_guide("regex", "a+", "r")).banned is None  # not JSON


def test_refused_guides_are_remembered_within_the_caches_bound(grammars, monkeypatch):
    """A client sending ever new schemas that do not compile cannot grow what is remembered."""
    monkeypatch.setattr("engine.guided.compiler.CACHE_ENTRIES", 2)
    bad = [text_guide("regex", f"a{i}(b", "r") for i in range(3)]
    for guide in bad:
        with pytest.raises(ValueError, match="does not compile"):
            grammars.compiled(guide)
    assert list(grammars._refused) == bad[1:]
