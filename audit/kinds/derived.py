"""The claim kinds that derive numbers from counts and sums over the log: ``ratio`` (one quotient
within bounds), ``compare`` (a comparison over the derived numbers) and ``control`` (the same
comparison against a control run's numbers, read from a second log).

One module for the three: they parse the same counts, sums and derived numbers (``let``), read
them with the same ``Numbers`` and decide through the same gates and zero-denominator rule; only
the last test differs (``Derived.judge``), and ``control`` is ``compare`` with a second log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from audit import expr
from audit.checker import Bus, Checker, Context, SelCount, outcome
from audit.kinds.base import ClaimKind, expression
from audit.model import Claim, ReceiptSel, Selector
from audit.parse_select import Events, err, field, keys, selectors
from audit.status import ClaimVerdict, Status


@dataclass(slots=True, frozen=True)
class Sum:
    select: tuple[ReceiptSel, ...]
    field: str


@dataclass(slots=True, frozen=True, kw_only=True)
class NumbersClaim(Claim):
    """What the three kinds share: counts and sums over the log, and numbers derived from them."""

    counts: dict[str, tuple[Selector, ...]]
    sums: dict[str, Sum]
    let: dict[str, expr.Expr]


@dataclass(slots=True, frozen=True, kw_only=True)
class RatioClaim(NumbersClaim):
    numerator: expr.Expr
    denominator: expr.Expr
    at_least: float | None = None
    at_most: float | None = None
    name: str  # the ratio's name in its sentence


@dataclass(slots=True, frozen=True, kw_only=True)
class CompareClaim(NumbersClaim):
    check: expr.Expr  # a comparison over the numbers


@dataclass(slots=True, frozen=True, kw_only=True)
class ControlClaim(CompareClaim):
    control_engaged: str | None = None  # a count or sum that must be non-zero in the control


def parse_sums(t: dict[str, Any], where: str, events: Events) -> dict[str, Sum]:
    """A claim's ``sum`` table: each name a field summed over the receipts its selector picks."""
    sums = {}
    for n, s in t.get("sum", {}).items():
        if not isinstance(s, dict):
            raise err(where, f"sum.{n} is a table with 'select' and 'field'")
        keys(s, {"select", "field"}, f"{where} sum.{n}")
        sel = selectors(s.get("select"), f"{where} sum.{n}", receipts_only=True, events=events)
        for r in sel:
            field(r, s.get("field", ""), f"{where} sum.{n}")
        sums[n] = Sum(sel, s["field"])
    return sums


_Numbers = tuple[dict[str, tuple[Selector, ...]], dict[str, Sum], dict[str, expr.Expr], set[str]]


def _numbers(t: dict[str, Any], where: str, control: bool, events: Events) -> _Numbers:
    """(counts, sums, let, the names an expression may use)."""
    counts = {
        n: selectors(s, f"{where} count.{n}", events=events) for n, s in t.get("count", {}).items()
    }
    sums = parse_sums(t, where, events)
    names = set(counts) | set(sums)
    if not names:
        raise err(where, "needs at least one 'count' or 'sum'")
    if control:
        names |= {f"control.{n}" for n in names}
    let = {}
    for n, src in t.get("let", {}).items():
        let[n] = expression(src, f"{where} let.{n}", names, comparison=False)
        names.add(n)
        if control:
            names.add(f"control.{n}")
    return counts, sums, let, names


def parse_ratio(t: dict[str, Any], where: str, head: Claim, events: Events) -> RatioClaim:
    counts, sums, let, names = _numbers(t, where, False, events)
    terms = {}
    for k in ("numerator", "denominator"):
        if k not in t:
            raise err(where, f"needs '{k}'")
        terms[k] = expression(t[k], f"{where} {k}", names, comparison=False)
    bounds: dict[str, float] = {}
    for k, a in (("min", "at_least"), ("max", "at_most")):
        if k in t:
            if not isinstance(t[k], int | float) or isinstance(t[k], bool):
                raise err(where, f"'{k}' is a number")
            bounds[a] = float(t[k])
    if not bounds:
        raise err(where, "a ratio needs 'min' or 'max'")
    name = str(t.get("name", head.id))
    return RatioClaim(
        **head.common(),
        counts=counts,
        sums=sums,
        let=let,
        numerator=terms["numerator"],
        denominator=terms["denominator"],
        at_least=bounds.get("at_least"),
        at_most=bounds.get("at_most"),
        name=name,
    )


def _check(t: dict[str, Any], where: str, names: set[str]) -> expr.Expr:
    if "check" not in t:
        raise err(where, "needs 'check'")
    return expression(t["check"], f"{where} check", names, comparison=True)


def parse_compare(t: dict[str, Any], where: str, head: Claim, events: Events) -> CompareClaim:
    counts, sums, let, names = _numbers(t, where, False, events)
    check = _check(t, where, names)
    return CompareClaim(**head.common(), counts=counts, sums=sums, let=let, check=check)


def parse_control(t: dict[str, Any], where: str, head: Claim, events: Events) -> ControlClaim:
    counts, sums, let, names = _numbers(t, where, True, events)
    check = _check(t, where, names)
    eng = t.get("control_engaged")
    if eng not in counts and eng not in sums and eng is not None:
        raise err(where, f"control_engaged {eng!r} is not a count or sum here")
    return ControlClaim(
        **head.common(), counts=counts, sums=sums, let=let, check=check, control_engaged=eng
    )


class Numbers:
    """The counts and sums a ratio/compare/control claim names, over one log."""

    def __init__(self, claim: NumbersClaim, bus: Bus) -> None:
        self.claim = claim
        self.counts = {n: SelCount(s, bus) for n, s in claim.counts.items()}
        self.sums: dict[str, float] = {n: 0 for n in claim.sums}
        for n, sm in claim.sums.items():
            for s in sm.select:
                bus.subscribe(s, self._sum_fn(n, s, sm.field))

    def _sum_fn(self, name: str, s: ReceiptSel, fname: str) -> Callable[[dict[str, Any]], None]:
        def fn(rec: dict[str, Any]) -> None:
            v = rec.get(fname)
            if isinstance(v, int | float) and not isinstance(v, bool) and s.matches(rec):
                self.sums[name] += v

        return fn

    def env(self, prefix: str = "") -> dict[str, Any]:
        env: dict[str, Any] = {prefix + n: c.count for n, c in self.counts.items()}
        env.update({prefix + n: v for n, v in self.sums.items()})
        return env

    def any_nonzero(self) -> bool:
        return any(c.count for c in self.counts.values()) or any(self.sums.values())


def _let(claim: NumbersClaim, env: dict[str, Any], prefix: str = "") -> list[str]:
    """Evaluate the derived numbers into ``env``; returns their sentences."""
    said = []
    for name, e in claim.let.items():
        scoped = (
            {k[len(prefix) :]: v for k, v in env.items() if k.startswith(prefix)} if prefix else env
        )
        value = e(scoped)
        env[prefix + name] = value
        said.append(f"{prefix}{name} = {e.source} = {e.shown(scoped)} = {expr._fmt(value)}")
    return said


D = TypeVar("D", bound=NumbersClaim)


class Derived(Checker[D]):
    """Numbers derived from counts, checked against a threshold (``judge``, the kind's own)."""

    def __init__(self, claim: D, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.numbers = Numbers(claim, bus)
        self.control: Numbers | None = None

    def early(self, ctx: Context) -> ClaimVerdict | None:
        """A verdict before the numbers are read (the control's gates)."""
        return None

    def engaged(self) -> bool:
        return self.numbers.any_nonzero()

    def judge(self, env: dict[str, Any], said: list[str]) -> ClaimVerdict:
        raise NotImplementedError

    def decide(self, ctx: Context) -> ClaimVerdict:
        early = self.early(ctx)
        if early:
            return early
        gated = self.gate(ctx, self.engaged(), "every count is zero: nothing to derive from")
        env = self.numbers.env()
        if self.control is not None:
            env.update(self.control.env("control."))
        if gated:
            gated.numbers.update(env)
            return gated
        said: list[str] = []  # what is derived before a zero denominator, for its sentence
        try:
            said = _let(self.claim, env)
            if self.control is not None:
                said += _let(self.claim, env, "control.")
            return self.judge(env, said)
        except expr.ZeroDivision:
            return outcome(
                Status.UNDECIDED,
                f"a denominator is zero ({'; '.join(said) or 'counts'}): the number does not exist",
                "zero_denominator",
                **env,
            )


class Ratio(Derived[RatioClaim]):
    def judge(self, env: dict[str, Any], said: list[str]) -> ClaimVerdict:
        c = self.claim
        num, den = c.numerator(env), c.denominator(env)
        if den == 0:
            return outcome(
                Status.UNDECIDED,
                "; ".join(
                    [
                        *said,
                        f"{c.name} = {c.numerator.source} / {c.denominator.source}: "
                        f"{c.denominator.source} = 0, the ratio does not exist",
                    ]
                ),
                "zero_denominator",
                **env,
            )
        value = num / den
        env[c.name] = round(value, 6)
        bounds = []
        ok = True
        if c.at_least is not None:
            bounds.append(f">= {c.at_least:g}")
            ok &= value >= c.at_least
        if c.at_most is not None:
            bounds.append(f"<= {c.at_most:g}")
            ok &= value <= c.at_most
        why = "; ".join(
            [
                *said,
                f"{c.name} = {c.numerator.source} / {c.denominator.source} = "
                f"{expr._fmt(num)} / {expr._fmt(den)} = {value:.3g}, needed {' and '.join(bounds)}",
            ]
        )
        return outcome(Status.PASS if ok else Status.FAIL, why, **env)


C = TypeVar("C", bound=CompareClaim)


class Compare(Derived[C]):
    def judge(self, env: dict[str, Any], said: list[str]) -> ClaimVerdict:
        c = self.claim
        ok = c.check(env)
        shown = f"{c.check.source}: {c.check.shown(env)}"
        why = "; ".join([*said, shown + (" holds" if ok else " does not hold")])
        return outcome(Status.PASS if ok else Status.FAIL, why, **env)


class Control(Compare[ControlClaim]):
    """``compare`` with the control run's numbers (``control.NAME``) in scope too."""

    def subscribe_control(self, bus: Bus) -> None:
        self.control = Numbers(self.claim, bus)

    def engaged(self) -> bool:
        # a control claim that names its engagement (``requires``) is engaged by it: zero in
        # this run (no park at all) is then a result to compare, not nothing to derive from
        return self.numbers.any_nonzero() or self.requires is not None

    def early(self, ctx: Context) -> ClaimVerdict | None:
        c = self.claim
        if self.control is None or ctx.control_stats is None:
            return outcome(
                Status.UNDECIDED,
                "no control log was given (audit verdict ... --control CONTROL_LOG); this claim "
                "compares this run against one",
                "no_control",
            )
        incomplete = ctx.control_stats.incomplete()
        if incomplete is not None:
            return outcome(
                Status.UNDECIDED, f"control log: {incomplete[1]}", "control_" + incomplete[0]
            )
        if c.control_engaged is not None:
            value = self.control.env().get(c.control_engaged, 0)
            if not value:
                return outcome(
                    Status.UNDECIDED,
                    f"the control log has {c.control_engaged} = 0: the control never reached the "
                    "regime, so there is nothing to compare against",
                    "control_not_engaged",
                    **{f"control.{c.control_engaged}": value},
                )
        return None


_NUMBERS = {"count", "sum", "let"}
KINDS = (
    ClaimKind(
        "ratio",
        frozenset(_NUMBERS | {"numerator", "denominator", "min", "max", "name"}),
        parse_ratio,
        Ratio,
        can_fail=True,
    ),
    ClaimKind("compare", frozenset(_NUMBERS | {"check"}), parse_compare, Compare, can_fail=True),
    ClaimKind(
        "control",
        frozenset(_NUMBERS | {"check", "control_engaged"}),
        parse_control,
        Control,
        can_fail=True,
    ),
)
