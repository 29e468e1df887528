"""Every reason code the auditor can give a verdict is documented in runbooks/acceptance.md, and
the runbook documents no code the auditor cannot give.

A source pin, on purpose: the codes are literals spread over the checkers (the third argument
of ``outcome``) and the reader's ``ReadStats._incomplete`` (in audit/readstats.py), and an
operator who meets a code needs its row. Reading them from the source is the one way to see a
code no case reaches."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _reader_codes() -> set[str]:
    tree = ast.parse((ROOT / "audit" / "readstats.py").read_text())  # ReadStats lives there
    fn = next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_incomplete"
    )
    return {
        r.value.elts[0].value
        for r in ast.walk(fn)
        if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)
    }


def emitted_codes() -> set[str]:
    """The reason codes of audit/: literal ones, and the reader's, plain and for the control."""
    reader = _reader_codes()
    codes = set(reader)
    for path in sorted((ROOT / "audit").rglob("*.py")):  # the kind modules in audit/kinds too
        for n in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(n, ast.Call) and getattr(n.func, "id", None) == "outcome"):
                continue
            arg = n.args[2] if len(n.args) > 2 else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                codes.add(arg.value)
            elif isinstance(arg, ast.BinOp) and isinstance(arg.left, ast.Constant):
                codes |= {arg.left.value + c for c in reader}  # "control_" + the reader's code
            elif arg is not None:  # the reader's own reason, handed on
                codes |= reader
    return codes


def documented_codes() -> set[str]:
    text = (ROOT / "runbooks" / "acceptance.md").read_text()
    table = text.split("### Reason codes", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_<>]+)` \|", table, re.M))


def test_every_reason_code_the_auditor_can_give_is_in_the_runbook_and_no_other():
    emitted, documented = emitted_codes(), documented_codes()
    assert {"no_engagement", "seq_invalid", "in_flight_at_end", "control_seq_gap"} <= emitted
    control = {c for c in emitted if c.startswith("control_") and c[8:] in _reader_codes()}
    assert "control_<code>" in documented  # one row for the control log's incomplete reasons
    assert emitted - control - documented == set()
    assert documented - {"control_<code>"} - emitted == set()
