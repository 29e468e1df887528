"""Small arithmetic expressions for specs: names, numbers, + - * /, min/max/abs/len/distinct/outside,
and one comparison. Parsed once with ``ast`` into a closure; anything else is a spec error.

Division by zero is not an error: it yields ``ZeroDivision``, which a claim turns into
UNDECIDED (``zero_denominator``), never a number.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_CMP = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


def _distinct(*lists: Any) -> int:
    """How many different items the lists hold together (a rid in two lists counts once)."""
    return len({x for items in lists for x in items})


def _outside(items: Any, of: Any) -> int:
    """How many of ``items`` are not in ``of`` (a census before against the one after)."""
    held = set(of)
    return sum(1 for x in items if x not in held)


_FUNCS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "len": len,
    "distinct": _distinct,
    "outside": _outside,
}


class ExprError(ValueError):
    pass


class ZeroDivision(Exception):
    """A denominator was zero: the number does not exist."""


class Missing(Exception):
    """A name had no value (a field absent or null in this receipt)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


Env = Mapping[str, Any]


@dataclass(slots=True, frozen=True)
class Expr:
    source: str
    names: frozenset[str]
    _fn: Callable[[Env], Any]

    def __call__(self, env: Env) -> Any:
        return self._fn(env)

    def shown(self, env: Env) -> str:
        """The expression with each name replaced by its value: ``7 - 2``."""
        return re.sub(
            r"\b[A-Za-z_][A-Za-z_0-9.]*\b",
            lambda m: _fmt(env[m.group(0)]) if m.group(0) in env else m.group(0),
            self.source,
        )


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _name(name: str) -> Callable[[Env], Any]:
    """The value of ``name`` in an env (one call a lookup: invariants run on every receipt)."""

    def get(env: Env) -> Any:
        v = env.get(name)
        if v is None:
            raise Missing(name)
        return v

    return get


def _div(a: Any, b: Any) -> float:
    if b == 0:
        raise ZeroDivision()
    return a / b


def _compile(node: ast.AST, names: set[str]) -> Callable[[Env], Any]:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = node.value
        return lambda env: value
    if isinstance(node, ast.Name):
        names.add(node.id)
        return _name(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        dotted = f"{node.value.id}.{node.attr}"  # control.parks: a name from the control log
        names.add(dotted)
        return _name(dotted)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _compile(node.operand, names)
        return lambda env: -inner(env)
    if isinstance(node, ast.BinOp) and (type(node.op) in _BIN or isinstance(node.op, ast.Div)):
        left, right = _compile(node.left, names), _compile(node.right, names)
        op = _div if isinstance(node.op, ast.Div) else _BIN[type(node.op)]
        return lambda env: op(left(env), right(env))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
        and node.args
    ):
        fn = _FUNCS[node.func.id]
        args = [_compile(a, names) for a in node.args]
        return lambda env: fn(*(a(env) for a in args))
    raise ExprError(f"not allowed in an expression: {ast.unparse(node)!r}")


def parse(source: str, *, comparison: bool | None = None) -> Expr:
    """Parse ``source``; ``comparison`` True requires one comparison at the top (a check),
    False forbids it (a number), None allows either."""
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as e:
        raise ExprError(f"cannot parse {source!r}: {e.msg}") from None
    names: set[str] = set()
    is_cmp = isinstance(tree, ast.Compare)
    if is_cmp:
        if len(tree.ops) != 1 or type(tree.ops[0]) not in _CMP:
            raise ExprError(f"{source!r}: one comparison (< <= > >= == !=) is allowed")
        left, right = _compile(tree.left, names), _compile(tree.comparators[0], names)
        cmp = _CMP[type(tree.ops[0])]

        def fn(env: Env) -> Any:
            return cmp(left(env), right(env))
    else:
        fn = _compile(tree, names)
    if comparison is True and not is_cmp:
        raise ExprError(f"{source!r} must be a comparison such as 'a >= b'")
    if comparison is False and is_cmp:
        raise ExprError(f"{source!r} must be a number, not a comparison")
    return Expr(source.strip(), frozenset(names), fn)
