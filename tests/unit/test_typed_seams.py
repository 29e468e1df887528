"""Collaborators are typed (CONVENTIONS.md): where one part of the product hands another an
object to work with, the receiver names its type, or a small ``Protocol`` for the slice it uses
where importing the type would break the layering. ``Any`` there hides what is used, and with
it the cycles the layering forbids (the core's cutover, phase and info, the scheduler's
iteration receipt once took their owner as ``Any``).

The check walks every product module: a parameter, attribute or field whose name is a
collaborator's, annotated ``Any`` (alone or with ``None``) or not annotated at all, is flagged,
and so is a function of such a name that returns ``Any`` (a property). Genuinely dynamic values
(JSON, ``**fields``, ASGI scope and messages) carry other names; the few collaborators that stay
``Any`` stand in ALLOWED, each with why."""

from __future__ import annotations

import ast

from tests.product import source_files

# names that, in this code base, stand for an object another part hands over
COLLABORATORS = frozenset(
    {
        "admitter",
        "allocator",
        "backend",
        "cache",
        "comm",
        "compiler",
        "config",
        "conn",
        "core",
        "cutovers",
        "dist",
        "driver",
        "engine",
        "grammars",
        "group",
        "job",
        "join",
        "keeper",
        "kv",
        "limits",
        "loaded",
        "masks",
        "member",
        "memory",
        "metrics",
        "model",
        "op",
        "parser",
        "pending",
        "pipe",
        "policy",
        "pool",
        "quant",
        "receipts",
        "req_table",
        "runner",
        "sched",
        "scheduler",
        "service",
        "store",
        "tier",
        "tokenizer",
        "tracing",
    }
)

# "path scope name": the collaborators left ``Any``, and why
ALLOWED = {
    # the tokenizers library's own object, used through a handful of its methods
    "engine/model/tokenizer.py Tokenizer.__init__ backend",
    # engine.model.tokenizer.Tokenizer, pickled across; the request room is below the model
    # room, so only the message's reader (the driver) names the type
    "engine/request/messages.py Ready tokenizer",
    # boot.start's configuration as a log holds it: JSON, checked field by field there
    "audit/boot_ranks.py declared_ranks config",
}

_ANY = {"Any", "typing.Any", "Any | None", "None | Any", "Optional[Any]"}


def _untyped(annotation: ast.expr | None) -> bool:
    return annotation is None or ast.unparse(annotation) in _ANY


def _is_collaborator(name: str) -> bool:
    return name.lstrip("_") in COLLABORATORS


def _target_name(target: ast.expr) -> str | None:
    if isinstance(target, ast.Attribute):  # self.tokenizer: Any = None
        return target.attr
    return target.id if isinstance(target, ast.Name) else None


def untyped_collaborators(sources: dict[str, str]) -> set[str]:
    """Each collaborator of ``sources`` (path -> text) typed ``Any`` or not typed, as
    ``"path scope name"``."""
    found: set[str] = set()

    def visit(path: str, node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            where = ".".join(scope)
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = ".".join([*scope, child.name])
                a = child.args
                for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
                    if _is_collaborator(arg.arg) and _untyped(arg.annotation):
                        found.add(f"{path} {inner} {arg.arg}")
                if _is_collaborator(child.name) and child.returns is not None:
                    if _untyped(child.returns):
                        found.add(f"{path} {where} {child.name}")
                visit(path, child, [*scope, child.name])
            elif isinstance(child, ast.ClassDef):
                visit(path, child, [*scope, child.name])
            else:
                if isinstance(child, ast.AnnAssign) and _untyped(child.annotation):
                    name = _target_name(child.target)
                    if name is not None and _is_collaborator(name):
                        found.add(f"{path} {where} {name}")
                visit(path, child, scope)

    for path, text in sources.items():
        visit(path, ast.parse(text), [])
    return found


def test_no_collaborator_is_typed_any():
    found = untyped_collaborators(source_files())
    untyped, stale = sorted(found - ALLOWED), sorted(ALLOWED - found)
    assert not untyped, f"name the type, or a Protocol of the slice used: {untyped}"
    assert not stale, f"typed now, take it off ALLOWED: {stale}"


def test_the_check_flags_each_form_of_an_untyped_collaborator():
    source = """
from dataclasses import dataclass
from typing import Any, Optional


def run(core: Any, conn, sched: Any | None = None, *args: Any, **fields: Any) -> None: ...


@dataclass
class Held:
    driver: Optional[Any]
    payload: Any  # a value, not a collaborator: never flagged


class Owner:
    def __init__(self, model: "LlamaModel") -> None:
        self.tokenizer: Any = None

    @property
    def scheduler(self) -> Any: ...
"""
    assert untyped_collaborators({"m.py": source}) == {
        "m.py run core",
        "m.py run conn",
        "m.py run sched",
        "m.py Held driver",
        "m.py Owner.__init__ tokenizer",
        "m.py Owner scheduler",
    }
