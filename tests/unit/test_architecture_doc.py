"""The architecture's front door stays true: docs/ARCHITECTURE.md is at most 4,000 words and opens
with the map, and every file, function, class, receipt kind and flag it and docs/IN_DEPTH.md name
in code spans exists."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.product import PACKAGES, ROOT, source_files

DOC = ROOT / "docs" / "ARCHITECTURE.md"
TOPS = (*PACKAGES, "tests", "bench", "runbooks", "docs", ".ci")
# Names the doc uses that are not ours to define: HTTP's, the libraries', the shell's.
FOREIGN = {"None", "True", "False", "Host", "Origin", "Bearer", "CORSMiddleware", "Starlette"}
PATH = re.compile(r"^(?:\.ci|[a-z_]+)/[\w./-]*$|^[\w/-]+\.(?:py|c|cpp|h|md|toml|json)$")
QUALIFIED = re.compile(r"^([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\(\))?$")
CLASSLIKE = re.compile(r"^[A-Z][a-z0-9]+[A-Z]\w*$|^[A-Z][a-z]+$")


@cache
def definitions() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Module basename -> names defined at its top; class name -> names defined on it."""
    modules: dict[str, set[str]] = {}
    classes: dict[str, set[str]] = {}
    for where, text in source_files((*PACKAGES, "tests")).items():
        path, tree = Path(where), ast.parse(text)
        top = modules.setdefault(path.stem if path.stem != "__init__" else path.parent.name, set())
        for node in tree.body:
            top |= _names(node)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                members = classes.setdefault(node.name, set())
                for item in ast.walk(node):
                    members |= _names(item)
                    if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        members.add(item.attr)
    return modules, classes


def _names(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return set()


@cache
def receipt_kinds() -> frozenset[str]:
    from engine.observability import schema

    return frozenset(schema.CATALOG)


@cache
def product_text() -> str:
    return "\n".join(source_files().values())


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def defined_in(path: Path, name: str) -> bool:
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
        for n in ast.walk(parsed(path))
    )


def wrong_names(text: str) -> list[str]:
    """Each code span of ``text`` that names something of the project that does not exist."""
    modules, classes = definitions()
    wrong, last_file = [], None
    for span in re.findall(r"`([^`\n]+)`", text):
        span = span.strip()
        if span.startswith("::") and last_file is not None:
            if not defined_in(last_file, span[2:]):
                wrong.append(span)
            continue
        head, _, test = span.partition("::")
        if PATH.match(head) and head.split("/")[0] in TOPS:
            path = ROOT / head
            if not path.exists():
                wrong.append(span)
            elif test and not defined_in(path, test):
                wrong.append(span)
            elif path.suffix == ".py":
                last_file = path
            continue
        if span in receipt_kinds() or span in FOREIGN:
            continue
        if span.startswith("--"):
            flag = span.split()[0].split("=")[0]
            if flag not in product_text() and flag[2:].replace("-", "_") not in product_text():
                wrong.append(span)
            continue
        m = QUALIFIED.match(span)
        if m:
            owner, name = m.groups()
            if owner in classes:
                if name not in classes[owner]:
                    wrong.append(span)
            elif owner in modules and name not in modules[owner]:
                wrong.append(span)
            continue
        if (
            CLASSLIKE.match(span)
            and span not in classes
            and not any(span in n for n in modules.values())
        ):
            wrong.append(span)
    return wrong


@pytest.mark.parametrize("doc", ["ARCHITECTURE.md", "IN_DEPTH.md"])
def test_every_name_the_docs_give_exists(doc):
    assert wrong_names((ROOT / "docs" / doc).read_text()) == []


def test_the_check_finds_a_name_that_drifted():
    text = (
        "`engine/scheduler/memory.py` `Memory.make_room` `Memory.make_rooms` `engine/sched/` "
        "`admission.plan_chunk` `admission.plan_chunks` `admission.park` `NoSuchThing` "
        "`tests/unit/test_layering.py::test_import_contracts_are_kept` `::test_gone` `--step-tokens` `--no-such-flag`"
    )
    assert wrong_names(text) == [
        "Memory.make_rooms",
        "engine/sched/",
        "admission.plan_chunks",
        "NoSuchThing",
        "::test_gone",
        "--no-such-flag",
    ]


def test_the_map_is_short_and_comes_first():
    text = DOC.read_text()
    assert len(text.split()) <= 4000
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:2] == ["The map", "To change X, open Y"]
