"""Specs: scoped selectors only, and anything the schema does not know is a bad spec, never a
selector that silently counts zero."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.model import ReceiptSel, TextSel
from audit.parse import SpecError, parse_spec


def spec(claims: str, regime: str = "") -> str:
    return f'description = "t"\n{regime}\n{claims}'


def parse(text: str):
    return parse_spec(text, Path("acceptance/t/spec.toml"))


ENGAGED = '[[claim]]\nid = "c"\nkind = "engaged"\nselect = {sel}\n'


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ('{ kind = "admission.parked" }', "receipt kind 'admission.parked' is not in the schema"),
        ('{ kind = "admission.park", where = { acked = 1 } }', "has no field 'acked'"),
        ('{ kind = "admission.park", where = { need = { "~" = 1 } } }', "unknown operator '~'"),
        ('{ kind = "admission.park", where = { rid = { regex = "(" } } }', "bad regex"),
        ('{ kind = "admission.park", where = { need = { ">" = "x" } } }', "takes a number"),
        ('{ source = "text", regex = "acked=.*" }', "must name a receipt kind"),
        ('{ kind = "eviction", regex = "x" }', "unknown key(s) regex"),
        ("[]", "empty selector list"),
        ('{ regex = "acked" }', "must name a receipt kind"),
    ],
)
def test_bad_selectors_are_spec_errors(select, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(spec(ENGAGED.format(sel=select)))


def test_optional_fields_the_engine_writes_can_be_selected():
    s = parse(
        spec(
            ENGAGED.format(
                sel='{ kind = "admission.park", where = { local_avail = 0, floor = { exists = false } } }'
            )
        )
    )
    sel = s.claims[0].select[0]
    assert isinstance(sel, ReceiptSel)
    assert sel.matches({"local_avail": 0, "floor": None})
    assert not sel.matches({"local_avail": 3, "floor": None})
    assert not sel.matches({"local_avail": 0, "floor": 5})


NEVER = (
    '[[claim]]\nid = "c"\nkind = "never"\nrequires = {{ kind = "boot.ready" }}\nselect = {sel}\n'
)


def test_text_selectors_are_bound_to_a_source_and_match_whole_lines():
    s = parse(
        spec(
            NEVER.format(
                sel="{ source = \"text\", regex = 'Traceback \\(most recent call last\\):' }"
            )
        )
    )
    sel = s.claims[0].select[0]
    assert isinstance(sel, TextSel) and sel.source == "text"
    assert sel.matches("Traceback (most recent call last):")
    assert not sel.matches("INFO saw Traceback (most recent call last): in a test")
    with pytest.raises(SpecError, match="unknown text source 'stderr'"):
        parse(spec(NEVER.format(sel='{ source = "stderr", regex = "x" }')))
    with pytest.raises(SpecError, match="needs a non-empty 'regex'"):
        parse(spec(NEVER.format(sel='{ source = "text" }')))
    with pytest.raises(SpecError, match="a selector names a receipt 'kind'"):
        parse(spec(NEVER.format(sel='{ regex = "acked=.*" }')))


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        ('id = "c"\nkind = "never"\nselect = { kind = "alloc.oom" }', "needs 'requires'"),
        (
            'id = "c"\nkind = "engaged"\nselect = { kind = "eviction" }\nalow_vacuous = true',
            "unknown key(s) alow_vacuous",
        ),
        ('id = "c"\nkind = "sometimes"', "unknown claim kind"),
        ('id = "C c"\nkind = "engaged"', "lower_snake_case"),
        (
            'id = "c"\nkind = "invariant"\nselect = { kind = "eviction" }\ncheck = "evicted >= acked"',
            "names acked",
        ),
        (
            'id = "c"\nkind = "invariant"\nselect = { kind = "eviction" }\ncheck = "evicted"',
            "must be a comparison",
        ),
        (
            'id = "c"\nkind = "invariant"\nselect = { kind = "eviction" }\ncheck = "__import__(1) > 0"',
            "not allowed",
        ),
        (
            'id = "c"\nkind = "every"\nwhen = { kind = "retract" }\nthen = { kind = "requeue" }',
            "has no field 'rid'",
        ),
        (
            'id = "c"\nkind = "ratio"\ncount = { a = { kind = "eviction" } }\nnumerator = "a"\ndenominator = "b"\nmin = 1',
            "names b",
        ),
        (
            'id = "c"\nkind = "ratio"\ncount = { a = { kind = "eviction" } }\nnumerator = "a"\ndenominator = "a"',
            "needs 'min' or 'max'",
        ),
        (
            'id = "c"\nkind = "compare"\nsum = { a = { select = { kind = "eviction" }, field = "acked" } }\ncheck = "a > 0"',
            "has no field 'acked'",
        ),
        (
            'id = "c"\nkind = "control"\ncount = { a = { kind = "eviction" } }\ncheck = "a <= control.b"',
            "names control.b",
        ),
        (
            'id = "c"\nkind = "ranks_agree"\nselect = { kind = "admission.park" }\nfields = ["tokens"]',
            "has no field 'tokens'",
        ),
        (
            'id = "c"\nkind = "never"\nrequires = { kind = "boot.ready" }\nselect = { signal = "stall" }',
            "unknown signal",
        ),
    ],
)
def test_bad_claims_are_spec_errors(claim, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(spec("[[claim]]\n" + claim + "\n"))


def test_whole_spec_errors():
    with pytest.raises(SpecError, match="not valid TOML"):
        parse("[[claim")
    with pytest.raises(SpecError, match="at least one"):
        parse('description = "x"')
    with pytest.raises(SpecError, match="duplicate claim id"):
        parse(spec(ENGAGED.format(sel='{ kind = "eviction" }') * 2))
