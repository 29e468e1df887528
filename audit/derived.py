"""The claims that derive numbers from counts and sums: ``ratio`` (one quotient within bounds),
``compare`` (a comparison over the derived numbers) and ``control`` (the same comparison against
a control run's numbers, read from a second log).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from audit import expr
from audit.checker import Bus, Checker, Context, SelCount, outcome
from audit.model import Claim, ReceiptSel
from audit.status import ClaimVerdict, Status


class Numbers:
    """The counts and sums a ratio/compare/control claim names, over one log."""

    def __init__(self, claim: Claim, bus: Bus) -> None:
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


def _let(claim: Claim, env: dict[str, Any], prefix: str = "") -> list[str]:
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


class Derived(Checker):
    """ratio, compare and control: numbers derived from counts, checked against a threshold."""

    def __init__(self, claim: Claim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.numbers = Numbers(claim, bus)
        self.control: Numbers | None = None

    def subscribe_control(self, bus: Bus) -> None:
        if self.claim.kind == "control":
            self.control = Numbers(self.claim, bus)

    def decide(self, ctx: Context) -> ClaimVerdict:
        c = self.claim
        if c.kind == "control":
            early = self._control_gate(ctx)
            if early:
                return early
        # a control claim that names its engagement (``requires``) is engaged by it: zero in
        # this run (no park at all) is then a result to compare, not nothing to derive from
        engaged = self.numbers.any_nonzero() or (c.kind == "control" and self.requires is not None)
        gated = self.gate(ctx, engaged, "every count is zero: nothing to derive from")
        env = self.numbers.env()
        if self.control is not None:
            env.update(self.control.env("control."))
        if gated:
            gated.numbers.update(env)
            return gated
        try:
            said = _let(c, env)
            if self.control is not None:
                said += _let(c, env, "control.")
            if c.kind == "ratio":
                return self._ratio(env, said)
            ok = c.check(env)
        except expr.ZeroDivision:
            return outcome(
                Status.UNDECIDED,
                f"a denominator is zero ({'; '.join(said) or 'counts'}): the number does not exist",
                "zero_denominator",
                **env,
            )
        shown = f"{c.check.source}: {c.check.shown(env)}"
        why = "; ".join([*said, shown + (" holds" if ok else " does not hold")])
        return outcome(Status.PASS if ok else Status.FAIL, why, **env)

    def _ratio(self, env: dict[str, Any], said: list[str]) -> ClaimVerdict:
        c = self.claim
        num, den = c.numerator(env), c.denominator(env)
        if den == 0:
            return outcome(
                Status.UNDECIDED,
                "; ".join([*said, f"{c.name} = {c.numerator.source} / {c.denominator.source}: "
                           f"{c.denominator.source} = 0, the ratio does not exist"]),
                "zero_denominator",
                **env,
            )  # fmt: skip
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
            [*said, f"{c.name} = {c.numerator.source} / {c.denominator.source} = "
                    f"{expr._fmt(num)} / {expr._fmt(den)} = {value:.3g}, needed {' and '.join(bounds)}"]
        )  # fmt: skip
        return outcome(Status.PASS if ok else Status.FAIL, why, **env)

    def _control_gate(self, ctx: Context) -> ClaimVerdict | None:
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
