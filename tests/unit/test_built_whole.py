"""Built whole: every collaborator is handed what it uses in its constructor, and no code sets an
attribute of another object after it is built (``cache.tier = ...``, ``admitter.held = ...``).

Read from the source, not from a run, so a path no test drives is held to it too. A
*collaborator* is a class with behaviour (not a dataclass, ``NamedTuple``, ``Protocol`` or a
``__slots__`` record such as a radix node, whose fields their owner moves by design). Its
attributes are the names it assigns as ``self.NAME``; assigning one of them through anything
but ``self`` (``other.NAME = ...``, ``other.NAME[i] = ...``, ``other.NAME += ...``,
``setattr``) is a violation, unless a record declares a field of that name too."""

from __future__ import annotations

import ast

from tests.product import source_files

RECORD_BASES = {"NamedTuple", "TypedDict", "Protocol", "Enum"}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _slots(cls: ast.ClassDef) -> list[str] | None:
    for st in cls.body:
        if isinstance(st, ast.Assign) and any(_name(t) == "__slots__" for t in st.targets):
            return [c.value for c in ast.walk(st.value) if isinstance(c, ast.Constant)]
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def _set_attributes(node: ast.AST) -> list[ast.Attribute]:
    """The attributes an assignment statement sets (through subscripts and tuples too)."""
    out = []
    for target in _targets(node):
        out += [a for a in ast.walk(target) if isinstance(a, ast.Attribute)]
    return out


def _through_self(a: ast.Attribute) -> bool:
    return isinstance(a.value, ast.Name) and a.value.id in ("self", "cls")


def survey(sources: dict[str, str]) -> list[str]:
    """Violations in ``sources`` (path -> text), as ``path:line: .NAME set from outside``."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    record_fields: set[str] = set()
    owned: dict[str, str] = {}
    for path, tree in trees.items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            decorated = any(_name(d) == "dataclass" for d in cls.decorator_list)
            if decorated or {_name(b) for b in cls.bases} & RECORD_BASES:
                record_fields |= {
                    st.target.id
                    for st in cls.body
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                }
            elif (slots := _slots(cls)) is not None:
                record_fields |= set(slots)
            else:
                for node in ast.walk(cls):
                    for a in _set_attributes(node):
                        if _through_self(a):
                            owned.setdefault(a.attr, f"{cls.name} ({path})")
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) == "setattr":
                found.append(f"{path}:{node.lineno}: setattr")
            for a in _set_attributes(node):
                if not _through_self(a) and a.attr in owned and a.attr not in record_fields:
                    found.append(
                        f"{path}:{node.lineno}: .{a.attr} set from outside {owned[a.attr]}"
                    )
    return found


def test_no_product_code_sets_another_objects_attribute():
    assert survey(source_files()) == []


WIRED_FROM_OUTSIDE = """
class Cache:
    def __init__(self):
        self.tier = None

class Tier:
    def __init__(self, cache):
        cache.tier = self
"""

SLOT_RECORD = """
class Node:
    __slots__ = ("value",)

class Cache:
    def __init__(self):
        self.value = 0

def move(node):
    node.value = 1
"""


def test_the_survey_catches_a_collaborator_completed_from_outside():
    assert survey({"m.py": WIRED_FROM_OUTSIDE}) == ["m.py:8: .tier set from outside Cache (m.py)"]
    tabled = "class T:\n    def __init__(self):\n        self.table = []\n\ndef f(t):\n    t.table[0] = 1\n"
    assert survey({"t.py": tabled}) == ["t.py:6: .table set from outside T (t.py)"]
    assert survey({"s.py": "def f(o):\n    setattr(o, 'x', 1)\n"}) == ["s.py:2: setattr"]


def test_the_survey_leaves_records_and_own_attributes_alone():
    assert survey({"r.py": SLOT_RECORD}) == []
