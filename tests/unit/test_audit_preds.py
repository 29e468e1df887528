"""A selector's field predicates (``audit.model.Pred``, made once per operator) against the rule
each operator states, on any record: a missing field is None, an order holds only for a number
that is not a bool, a regex matches a whole str."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from audit.model import OPS, Pred, ReceiptSel

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(-3, 3),
    st.sampled_from(["a", "ab"]),
    st.lists(st.integers(0, 2), max_size=2),
)


def rule(op: str, v: Any, value: Any) -> bool:
    """What each operator means, said plainly."""
    number = isinstance(v, int | float) and not isinstance(v, bool)
    return {
        "exists": lambda: (v is not None) == bool(value),
        "==": lambda: v == value,
        "!=": lambda: v != value,
        "in": lambda: v in value,
        "not_in": lambda: v not in value,
        "regex": lambda: isinstance(v, str) and value.fullmatch(v) is not None,
        "<": lambda: number and v < value,
        "<=": lambda: number and v <= value,
        ">": lambda: number and v > value,
        ">=": lambda: number and v >= value,
    }[op]()


def operand(op: str, draw_number: float, draw_list: list, flag: bool) -> Any:
    if op == "regex":
        return re.compile("a+")
    if op in ("in", "not_in"):
        return draw_list
    if op == "exists":
        return flag
    return draw_number


@settings(max_examples=500)
@given(
    op=st.sampled_from(OPS),
    v=values,
    number=st.integers(-2, 2) | st.floats(-2, 2),
    listed=st.lists(values, max_size=3),
    flag=st.booleans(),
    present=st.booleans(),
)
def test_a_predicate_tests_a_field_as_its_operator_states(op, v, number, listed, flag, present):
    value = operand(op, number, [x for x in listed if not isinstance(x, list)], flag)
    rec = {"f": v, "other": 1} if present else {"other": 1}
    try:
        want = rule(op, v if present else None, value)
    except TypeError:  # an unhashable value in a list: raised both ways
        want = TypeError
    try:
        got = Pred("f", op, value).test(rec)
    except TypeError:
        got = TypeError
    assert got == want


@given(a=st.integers(0, 3), b=st.integers(0, 3))
def test_a_selector_matches_a_record_that_passes_every_predicate(a, b):
    sel = ReceiptSel("k", (Pred("a", ">=", 1), Pred("b", "in", [2, 3])))
    assert sel.matches({"a": a, "b": b}) == (a >= 1 and b in (2, 3))
    assert ReceiptSel("k").matches({}) is True
    assert ReceiptSel("k", (Pred("a", "==", 2),)).matches({"a": a}) == (a == 2)
    assert sel == ReceiptSel("k", (Pred("a", ">=", 1), Pred("b", "in", [2, 3])))
