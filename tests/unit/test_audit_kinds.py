"""The registry of claim kinds (``audit.kinds.KINDS``) is the one place a kind is known: every kind
a shipped window names resolves to its module, each module declares its parser, checker and
whether it can FAIL, a kind declared in one module alone (here, in this file) is parsed, checked
and self-tested with nothing else touched, and a name registered twice is refused."""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from audit import kinds
from audit.checker import Bus, Checker, Context, outcome
from audit.kinds import KINDS, registry
from audit.kinds.base import ClaimKind
from audit.model import Claim
from audit.parse import SpecError, parse_spec
from audit.parse_select import Events
from audit.selftest import self_test
from audit.spec import load_spec, shipped
from audit.status import ClaimVerdict, Status
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText


def test_every_kind_a_shipped_window_names_is_registered():
    named = {c.kind for w in shipped() for c in load_spec(w).claims}
    assert len(named) >= 8 and named <= set(KINDS), named - set(KINDS)


def test_each_kind_module_declares_its_parser_checker_and_what_it_can_decide():
    declared = {}
    for module in kinds.MODULES:
        assert module.KINDS, f"{module.__name__} declares no kind"
        for k in module.KINDS:
            assert isinstance(k, ClaimKind) and isinstance(k.can_fail, bool)
            # the kind's parsing and checking are its module's own, not borrowed from elsewhere
            assert k.parse.__module__ == module.__name__, (k.name, k.parse)
            assert k.checker.__module__ == module.__name__, (k.name, k.checker)
            declared[k.name] = k
    assert declared == dict(KINDS)
    assert not KINDS["engaged"].can_fail and KINDS["never"].can_fail


def test_every_module_of_the_kinds_package_is_registered():
    registered = {m.__name__.rsplit(".", 1)[1] for m in kinds.MODULES}
    found = {m.name for m in pkgutil.iter_modules(kinds.__path__)} - {"base"}
    assert found == registered, f"not in kinds.MODULES: {sorted(found - registered)}"


def test_a_kind_registered_twice_is_refused():
    with pytest.raises(ValueError, match="claim kind 'never' is registered twice"):
        registry([*KINDS.values(), KINDS["never"]])


# A toy kind, declared here as a kind module would declare it: its parameters, parser, checker.
@dataclass(slots=True, frozen=True, kw_only=True)
class AtMost(Claim):
    at_most: int


class CountReceipts(Checker[AtMost]):
    def __init__(self, claim: AtMost, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.seen = 0
        bus.any.append(self._count)

    def _count(self, rec: dict[str, Any]) -> None:
        self.seen += 1

    def decide(self, ctx: Context) -> ClaimVerdict:
        gated = self.gate(ctx, self.seen > 0, "no receipts")
        if gated:
            return gated
        ok = self.seen <= self.claim.at_most
        return outcome(Status.PASS if ok else Status.FAIL, f"{self.seen} receipts")


def _parse_at_most(t: dict[str, Any], where: str, head: Claim, events: Events) -> AtMost:
    return AtMost(**head.common(), at_most=int(t["at_most"]))


def _toy(can_fail: bool) -> ClaimKind:
    return ClaimKind("at_most", frozenset({"at_most"}), _parse_at_most, CountReceipts, can_fail)


TOY_SPEC = 'description = "t"\n[[claim]]\nid = "c"\nkind = "at_most"\nat_most = 2\n'


def test_a_kind_declared_in_one_module_is_parsed_checked_and_self_tested(monkeypatch, tmp_path):
    with pytest.raises(SpecError, match="unknown claim kind 'at_most'"):
        parse_spec(TOY_SPEC, Path("t/spec.toml"))
    monkeypatch.setattr(kinds, "KINDS", registry([*KINDS.values(), _toy(can_fail=True)]))
    with pytest.raises(SpecError, match=r"unknown key\(s\) most \(allowed: .*at_most"):
        parse_spec(TOY_SPEC + "most = 1\n", Path("t/spec.toml"))
    spec = parse_spec(TOY_SPEC, Path("t/spec.toml"))
    log = LogText().ready().park("r-1").stop().write(tmp_path / "boot.log")
    v = evaluate([spec], [log]).specs[0].claims[0]
    assert (v.claim, v.kind, v.status, v.why) == ("c", "at_most", "FAIL", "4 receipts")

    # the self-test asks a FAIL case of a kind that can fail, and only of one
    window = tmp_path / "w"
    (window / "cases").mkdir(parents=True)
    (window / "spec.toml").write_text(TOY_SPEC)
    (window / "cases" / "quiet.toml").write_text(
        'log = ""\n[expect]\noverall = "UNDECIDED"\nclaims = { c = "UNDECIDED" }\n'
    )
    assert self_test(load_spec(window)).coverage == ["c: no case makes it FAIL"]
    monkeypatch.setattr(kinds, "KINDS", registry([*KINDS.values(), _toy(can_fail=False)]))
    assert self_test(load_spec(window)).coverage == []
