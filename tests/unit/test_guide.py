"""A guide is checked where the request comes in: an invalid JSON schema, or one that uses a
keyword the grammar cannot enforce, is refused naming the place in the schema; property names
and data are never read as keywords. Torch-free, as the HTTP process is."""

from __future__ import annotations

import pytest

from engine.guided.tools import plan_of
from engine.request.guide import (
    MAX_GUIDE_BYTES,
    UNENFORCED,
    Guide,
    GuideError,
    choice_guide,
    json_schema_guide,
    text_guide,
)

P = "response_format.json_schema.schema"


def refused(schema, strict=False) -> GuideError:
    with pytest.raises(GuideError) as e:
        json_schema_guide(schema, strict, P)
    return e.value


def test_an_invalid_schema_is_refused_naming_where():
    e = refused({"type": "object", "properties": {"a": {"type": "strin"}}})
    assert e.param == f"{P}.properties.a.type"
    assert "not a valid JSON schema" in str(e)
    assert refused([1, 2]).param == P  # not an object at all


@pytest.mark.parametrize("keyword", sorted(UNENFORCED - {"$dynamicRef", "$recursiveRef"}))
def test_an_unenforced_keyword_is_refused_wherever_it_sits(keyword):
    value = {"uniqueItems": True, "minContains": 1, "maxContains": 1}.get(keyword, {})
    if keyword == "dependentRequired":
        value = {"a": ["b"]}
    if keyword == "dependencies":
        value = {"a": ["b"]}
    schema = {"type": "object", "properties": {"xs": {"type": "array", "items": {keyword: value}}}}
    e = refused(schema)
    assert e.param == f"{P}.properties.xs.items.{keyword}"
    assert f"keyword {keyword!r} is not supported" in str(e)


def test_property_names_and_data_are_not_keywords():
    schema = {
        "type": "object",
        "properties": {"not": {"type": "string"}, "if": {"enum": [{"not": 1}]}},
        "default": {"uniqueItems": True},
        "examples": [{"contains": 1}],
    }
    guide = json_schema_guide(schema, True, P)
    assert guide.kind == "json_schema" and guide.strict


def test_allof_of_several_and_remote_refs_are_refused():
    assert refused({"allOf": [{"type": "integer"}, {"minimum": 1}]}).param == f"{P}.allOf"
    assert json_schema_guide({"allOf": [{"type": "integer"}]}, False, P)  # one is fine
    e = refused({"$ref": "https://example.com/s.json"})
    assert e.param == f"{P}.$ref" and "inside the schema" in str(e)


def test_a_schemas_key_order_is_kept_it_orders_the_output():
    """JSON output follows the order of the schema's properties: two schemas that differ only
    in that order are two guides."""
    a = json_schema_guide({"properties": {"b": {}, "a": {}}}, False, P)
    b = json_schema_guide({"properties": {"a": {}, "b": {}}}, False, P)
    assert a.spec == '{"properties":{"b":{},"a":{}}}' and a != b and a.digest != b.digest
    assert json_schema_guide({"properties": {"b": {}, "a": {}}}, False, P) == a
    assert json_schema_guide({"properties": {"b": {}, "a": {}}}, True, P) != a
    assert len(a.digest) == 16


def test_choices_regexes_and_grammars_must_be_non_empty_strings():
    assert choice_guide(["a", "b"], "c").spec == '["a","b"]'
    for bad in ([], ["a", ""], "a", [1]):
        with pytest.raises(GuideError, match="non-empty list"):
            choice_guide(bad, "c")
    with pytest.raises(GuideError, match="non-empty string"):
        text_guide("regex", "", "r")
    with pytest.raises(ValueError, match="guide kind"):
        Guide("yaml")


def test_a_guide_over_the_bound_is_refused_naming_the_bound_before_any_check():
    """Measured on its JSON text before anything reads it further: an invalid schema that is
    too large is refused for its size."""
    big = {"type": "object", "properties": {f"p{i:06d}": {"type": "strin"} for i in range(40_000)}}
    e = refused(big)
    assert e.param == P and f"at most {MAX_GUIDE_BYTES} bytes" in str(e)
    for bad in (
        lambda: text_guide("regex", "a" * (MAX_GUIDE_BYTES + 1), "r"),
        lambda: choice_guide(["x" * MAX_GUIDE_BYTES], "c"),
    ):
        with pytest.raises(GuideError, match=f"at most {MAX_GUIDE_BYTES} bytes"):
            bad()
    assert text_guide("regex", "a" * MAX_GUIDE_BYTES, "r").spec  # at the bound: taken


def test_tools_over_the_bound_together_are_refused_naming_the_bound():
    tool = {"type": "function", "function": {"name": "f", "description": "d" * 400_000}}
    tools = [{**tool, "function": {**tool["function"], "name": f"f{i}"}} for i in range(3)]
    with pytest.raises(GuideError, match=f"at most {MAX_GUIDE_BYTES} bytes") as e:
        plan_of(tools, "auto", True, native=False)
    assert e.value.param == "tools"
    assert plan_of(tools[:2], "auto", True, native=False).guide is not None
