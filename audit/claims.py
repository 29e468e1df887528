"""Claim checkers: each one subscribes to the receipts and text lines its selectors scope, keeps
the least state its question needs, and gives one verdict at the end.

The order of the gates is the same for every kind:
1. evidence that decides a FAIL by itself (a `never` signature seen, an `invariant` broken) is
   a FAIL even in an incomplete log -- a lost line cannot un-happen what was read;
2. an incomplete log (seq gap, duplicates, unparsed lines) makes every claim that needs all the
   receipts UNDECIDED with the reader's reason;
3. a mechanism that never engaged is UNDECIDED (``no_engagement``), or a PASS marked
   ``vacuous`` where the claim says ``allow_vacuous = true``;
4. then the claim decides.

"Later" means a higher ``seq`` on the same (boot, rank), so no verdict depends on the order in
which the lines of different ranks (or files) were interleaved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from audit import expr
from audit.reader import ReadStats
from audit.spec import Claim, ReceiptSel, Selector, TextSel, WedgeSel
from audit.verdict import ClaimVerdict, Status
from engine.obs import schema

MAX_NAMED = 5  # rids named in a sentence
_SHIFT = 64  # Every packs two seqs into one int
_LOW = (1 << _SHIFT) - 1
_MASK64 = (1 << 64) - 1


class Bus:
    """Who wants which lines: receipts by kind, receipts of any kind, text lines by source."""

    def __init__(self) -> None:
        self.kinds: dict[str, list[Callable[[dict[str, Any]], None]]] = defaultdict(list)
        self.any: list[Callable[[dict[str, Any]], None]] = []
        self.texts: dict[str, list[Callable[[str, str], None]]] = defaultdict(list)

    def receipt(self, rec: dict[str, Any]) -> None:
        for fn in self.kinds.get(rec["event"], ()):
            fn(rec)
        for fn in self.any:
            fn(rec)

    def text(self, source: str, line: str, where: str) -> None:
        for fn in self.texts.get(source, ()):
            fn(line, where)


@dataclass(slots=True)
class Context:
    stats: ReadStats
    control_stats: ReadStats | None = None


def _where(rec: dict[str, Any]) -> str:
    rid = f" rid {rec['rid']}" if "rid" in rec else ""
    return f"{rec['event']} (boot {rec['boot']} rank {rec['rank']} seq {rec['seq']} iter {rec.get('iter')}{rid})"


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_NAMED])
    return shown + (f" and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else "")


class WedgeDetector:
    """Work waiting while no tokens are scheduled, per (boot, rank), in receipt time.

    Waiting starts at a receipt that shows requests held back (``admission.defer``,
    ``admission.park``, an ``iteration`` with waiting + parked > 0) and ends at the next
    receipt that shows tokens scheduled (``admission.admit``, ``admission.unpark``,
    ``request.finish``, ``request.abort``, an ``iteration`` with running > 0) or an
    ``iteration`` with nothing waiting, parked or running. Each receipt of the rank measures
    the span so far; a span longer than the threshold is a wedge.
    """

    PROGRESS = frozenset(
        (
            schema.ADMISSION_ADMIT,
            schema.ADMISSION_UNPARK,
            schema.REQUEST_FINISH,
            schema.REQUEST_ABORT,
        )
    )

    def __init__(self, threshold_s: float, on_wedge: Callable[[str], None]) -> None:
        self.threshold_s = threshold_s
        self.on_wedge = on_wedge
        self.since: dict[tuple[str, int], tuple[float, dict[str, Any]]] = {}
        self.reported: set[tuple[str, int, float]] = set()

    def feed(self, rec: dict[str, Any]) -> None:
        ts = rec.get("ts")
        if not isinstance(ts, int | float):
            return
        key = (rec["boot"], rec["rank"])
        start = self.since.get(key)
        if start is not None and ts - start[0] > self.threshold_s:
            mark = (key[0], key[1], start[0])
            if mark not in self.reported:
                self.reported.add(mark)
                self.on_wedge(
                    f"work waited {ts - start[0]:.1f} s > {self.threshold_s:g} s with no tokens "
                    f"scheduled, from {_where(start[1])} to {_where(rec)}"
                )
        event = rec["event"]
        if event in self.PROGRESS or event == schema.BOOT_STOP:
            self.since.pop(key, None)
        elif event == schema.ITERATION:
            running = rec.get("running") or 0
            held = (rec.get("waiting") or 0) + (rec.get("parked") or 0)
            if running > 0 or held == 0:
                self.since.pop(key, None)
            elif start is None:
                self.since[key] = (ts, rec)
        elif event in (schema.ADMISSION_DEFER, schema.ADMISSION_PARK) and start is None:
            self.since[key] = (ts, rec)


class SelCount:
    """How many lines matched any of the selectors, and the first one (for the sentence)."""

    def __init__(self, sels: tuple[Selector, ...], bus: Bus) -> None:
        self.sels = sels
        self.count = 0
        self.first: str | None = None
        for s in sels:
            if isinstance(s, ReceiptSel):
                bus.kinds[s.kind].append(self._receipt_fn(s))
            elif isinstance(s, TextSel):
                bus.texts[s.source].append(self._text_fn(s))
            elif isinstance(s, WedgeSel):
                bus.any.append(WedgeDetector(s.threshold_s, self._hit).feed)

    def _hit(self, what: str) -> None:
        self.count += 1
        if self.first is None:
            self.first = what

    def _receipt_fn(self, s: ReceiptSel) -> Callable[[dict[str, Any]], None]:
        def fn(rec: dict[str, Any]) -> None:
            if s.where and not s.matches(rec):
                return
            self.count += 1
            if self.first is None:  # described once, not per match
                self.first = _where(rec)

        return fn

    def _text_fn(self, s: TextSel) -> Callable[[str, str], None]:
        def fn(line: str, where: str) -> None:
            if s.matches(line):
                self.count += 1
                if self.first is None:
                    self.first = f"{s.source} line at {where}: {line[:120]!r}"

        return fn

    def describe(self) -> str:
        return " | ".join(s.describe() for s in self.sels)


class Checker:
    """One claim. Subclasses subscribe in ``__init__`` and decide in ``decide``."""

    needs_complete = True

    def __init__(self, claim: Claim, bus: Bus) -> None:
        self.claim = claim
        self.requires = SelCount(claim.requires, bus) if claim.requires else None

    def subscribe_control(self, bus: Bus) -> None:
        """Only `control` claims read the control log."""

    def verdict(self, ctx: Context) -> ClaimVerdict:
        v = self.decide(ctx)
        v.claim, v.kind = self.claim.id, self.claim.kind
        return v

    def decide(self, ctx: Context) -> ClaimVerdict:
        raise NotImplementedError

    # the shared gates (2 and 3 of the module docstring)
    def gate(self, ctx: Context, engaged: bool, not_engaged_why: str) -> ClaimVerdict | None:
        if self.requires is not None and self.requires.count == 0:
            engaged = False
            not_engaged_why = f"{self.requires.describe()} never seen: the mechanism never engaged"
        incomplete = ctx.stats.incomplete()
        if self.needs_complete and incomplete is not None:
            return _v(Status.UNDECIDED, incomplete[1], incomplete[0])
        if not engaged:
            if self.claim.allow_vacuous:
                return _v(
                    Status.PASS, f"vacuous pass (allowed by the spec): {not_engaged_why}", "vacuous"
                )
            return _v(Status.UNDECIDED, not_engaged_why, "no_engagement")
        return None


def _v(status: Status, why: str, reason: str | None = None, **numbers: Any) -> ClaimVerdict:
    return ClaimVerdict("", "", status, why, reason, numbers)


class Engaged(Checker):
    needs_complete = False

    def __init__(self, claim: Claim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.sel = SelCount(claim.select, bus)

    def decide(self, ctx: Context) -> ClaimVerdict:
        n, need = self.sel.count, self.claim.min
        desc = self.sel.describe()
        gated = self.gate(
            ctx, n >= need, f"{n} {desc} seen, {need} needed: the window never reached its regime"
        )
        if gated:
            gated.numbers.update(seen=n, min=need)
            return gated
        return _v(
            Status.PASS, f"{n} {desc} seen (>= {need}); first: {self.sel.first}", seen=n, min=need
        )


class Never(Checker):
    def __init__(self, claim: Claim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.sel = SelCount(claim.select, bus)

    def decide(self, ctx: Context) -> ClaimVerdict:
        n = self.sel.count
        if n:
            return _v(Status.FAIL, f"{n} x {self.sel.describe()}; first: {self.sel.first}", found=n)
        gated = self.gate(ctx, True, "")
        if gated:
            gated.numbers.update(found=0)
            return gated
        st = ctx.stats
        return _v(
            Status.PASS,
            f"none of {self.sel.describe()} in {st.receipts} receipts and {st.text + st.foreign_json} "
            f"text lines ({self.requires.describe()} seen {self.requires.count})",
            found=0,
        )


class Every(Checker):
    """Each key with a `when` receipt has a `then` receipt at a higher seq on the same rank."""

    def __init__(self, claim: Claim, bus: Bus) -> None:
        super().__init__(claim, bus)
        # (boot, rank) -> key -> last seq of `when` << _SHIFT | last seq of `then` (one int per
        # key: this is the state that grows with the number of requests)
        self.seen: dict[tuple[str, int], dict[Any, int]] = defaultdict(dict)
        self.stops: dict[tuple[str, int], int] = {}
        for s in claim.when:
            bus.kinds[s.kind].append(self._fn(s, claim.when_key, True))
        for s in claim.then:
            bus.kinds[s.kind].append(self._fn(s, claim.then_key, False))
        bus.kinds[schema.BOOT_STOP].append(self._stop)

    def _fn(self, s: ReceiptSel, key: str, when: bool) -> Callable[[dict[str, Any]], None]:
        def fn(rec: dict[str, Any]) -> None:
            if s.where and not s.matches(rec):
                return
            keys = rec.get(key)
            table = self.seen[(rec["boot"], rec["rank"])]
            seq = rec["seq"]
            for k in keys if isinstance(keys, list) else (keys,):
                if k is None or isinstance(k, list | dict):
                    continue
                packed = table.get(k, 0)
                a, b = packed >> _SHIFT, packed & _LOW
                if when and seq > a:
                    table[k] = seq << _SHIFT | b
                elif not when and seq > b:
                    table[k] = a << _SHIFT | seq

        return fn

    def _stop(self, rec: dict[str, Any]) -> None:
        key = (rec["boot"], rec["rank"])
        self.stops[key] = max(self.stops.get(key, 0), rec["seq"])

    def decide(self, ctx: Context) -> ClaimVerdict:
        c = self.claim
        when = " | ".join(s.describe() for s in c.when)
        label = "rid" if c.when_key in ("rid", "rids") else c.when_key
        then = " | ".join(s.describe() for s in c.then)
        total, failed, open_ = 0, [], []
        for (boot, rank), table in sorted(self.seen.items()):
            stop = self.stops.get((boot, rank), 0)
            for k, packed in table.items():
                a, b = packed >> _SHIFT, packed & _LOW
                if not a:
                    continue
                total += 1
                if b < a:
                    (failed if stop > a else open_).append(f"{k} (rank {rank})")
        gated = self.gate(ctx, total > 0, f"no {when} seen: nothing to follow")
        nums = {"keys": total, "failed": len(failed), "open": len(open_)}
        if gated:
            gated.numbers.update(nums)
            return gated
        if failed:
            return _v(
                Status.FAIL,
                f"{len(failed)} of {total} {label}s from {when} had no later {then}, though "
                f"boot.stop followed: {_names(sorted(failed))}",
                failed_keys=sorted(failed)[:50],
                **nums,
            )
        if open_:
            return _v(
                Status.UNDECIDED,
                f"{len(open_)} of {total} {label}s from {when} are still open where the log "
                f"ends and no boot.stop followed (still running, or the log was cut): {_names(sorted(open_))}",
                "in_flight_at_end",
                open_keys=sorted(open_)[:50],
                **nums,
            )
        return _v(Status.PASS, f"all {total} {label}s from {when} later had {then}", **nums)


class Numbers:
    """The counts and sums a ratio/compare/control claim names, over one log."""

    def __init__(self, claim: Claim, bus: Bus) -> None:
        self.claim = claim
        self.counts = {n: SelCount(s, bus) for n, s in claim.counts.items()}
        self.sums: dict[str, float] = {n: 0 for n in claim.sums}
        for n, sm in claim.sums.items():
            for s in sm.select:
                bus.kinds[s.kind].append(self._sum_fn(n, s, sm.field))

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
        gated = self.gate(
            ctx, self.numbers.any_nonzero(), "every count is zero: nothing to derive from"
        )
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
            return _v(
                Status.UNDECIDED,
                f"a denominator is zero ({'; '.join(said) or 'counts'}): the number does not exist",
                "zero_denominator",
                **env,
            )
        shown = f"{c.check.source}: {c.check.shown(env)}"
        why = "; ".join([*said, shown + (" holds" if ok else " does not hold")])
        return _v(Status.PASS if ok else Status.FAIL, why, **env)

    def _ratio(self, env: dict[str, Any], said: list[str]) -> ClaimVerdict:
        c = self.claim
        num, den = c.numerator(env), c.denominator(env)
        if den == 0:
            return _v(
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
        return _v(Status.PASS if ok else Status.FAIL, why, **env)

    def _control_gate(self, ctx: Context) -> ClaimVerdict | None:
        c = self.claim
        if self.control is None or ctx.control_stats is None:
            return _v(
                Status.UNDECIDED,
                "no control log was given (audit verdict ... --control CONTROL_LOG); this claim "
                "compares this run against one",
                "no_control",
            )
        incomplete = ctx.control_stats.incomplete()
        if incomplete is not None:
            return _v(Status.UNDECIDED, f"control log: {incomplete[1]}", "control_" + incomplete[0])
        if c.control_engaged is not None:
            value = self.control.env().get(c.control_engaged, 0)
            if not value:
                return _v(
                    Status.UNDECIDED,
                    f"the control log has {c.control_engaged} = 0: the control never reached the "
                    "regime, so there is nothing to compare against",
                    "control_not_engaged",
                    **{f"control.{c.control_engaged}": value},
                )
        return None


class Invariant(Checker):
    """A relation on the fields of each matching receipt."""

    def __init__(self, claim: Claim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.checked = self.broken = self.unevaluable = 0
        self.first_broken: str | None = None
        self.first_missing: str | None = None
        for s in claim.select:
            bus.kinds[s.kind].append(self._fn(s))

    def _fn(self, s: ReceiptSel) -> Callable[[dict[str, Any]], None]:
        check = self.claim.check

        def fn(rec: dict[str, Any]) -> None:
            if s.where and not s.matches(rec):
                return
            try:
                ok = check(rec)
            except expr.Missing as e:
                self.unevaluable += 1
                if self.first_missing is None:
                    self.first_missing = f"{_where(rec)} has no {e.name}"
                return
            except (TypeError, expr.ZeroDivision):
                self.unevaluable += 1
                if self.first_missing is None:
                    self.first_missing = f"{_where(rec)}: {check.source} cannot be evaluated"
                return
            self.checked += 1
            if not ok:
                self.broken += 1
                if self.first_broken is None:
                    self.first_broken = f"{_where(rec)}: {check.source}: {check.shown(rec)}"

        return fn

    def decide(self, ctx: Context) -> ClaimVerdict:
        c = self.claim
        nums = {"checked": self.checked, "broken": self.broken, "unevaluable": self.unevaluable}
        if self.broken:
            return _v(
                Status.FAIL,
                f"{self.broken} of {self.checked} receipts break it; first: {self.first_broken}",
                **nums,
            )
        sel = " | ".join(s.describe() for s in c.select)
        gated = self.gate(
            ctx, self.checked + self.unevaluable > 0, f"no {sel} seen: nothing to check"
        )
        if gated:
            gated.numbers.update(nums)
            return gated
        if self.unevaluable:
            return _v(
                Status.UNDECIDED,
                f"{self.unevaluable} receipt(s) cannot be checked; first: {self.first_missing}",
                "missing_field",
                **nums,
            )
        return _v(
            Status.PASS, f"{c.check.source} holds in all {self.checked} {sel} receipts", **nums
        )


class RanksAgree(Checker):
    """Per iteration, every rank of a boot made the same decisions (an order-free multiset
    digest of the selected receipts' fields)."""

    def __init__(self, claim: Claim, bus: Bus) -> None:
        super().__init__(claim, bus)
        # (boot, rank) -> iter -> count << 64 | (sum of the decisions' hashes mod 2^64)
        self.digest: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
        self.top_iter: dict[tuple[str, int], int] = {}
        self.decisions = 0
        for s in claim.select:
            bus.kinds[s.kind].append(self._fn(s))
        bus.any.append(self._iter)

    def _iter(self, rec: dict[str, Any]) -> None:
        it = rec.get("iter")
        if type(it) is int:
            key = (rec["boot"], rec["rank"])
            if it > self.top_iter.get(key, -1):
                self.top_iter[key] = it

    def _fn(self, s: ReceiptSel) -> Callable[[dict[str, Any]], None]:
        fields = self.claim.fields

        def fn(rec: dict[str, Any]) -> None:
            it = rec.get("iter")
            if type(it) is not int or (s.where and not s.matches(rec)):
                return
            item = (rec["event"], *(_frozen(rec.get(f)) for f in fields))
            per_iter = self.digest[(rec["boot"], rec["rank"])]
            d = per_iter.get(it, 0)
            per_iter[it] = ((d >> 64) + 1) << 64 | ((d & _MASK64) + hash(item)) & _MASK64
            self.decisions += 1

        return fn

    def decide(self, ctx: Context) -> ClaimVerdict:
        ranks: dict[str, list[int]] = defaultdict(list)
        for boot, rank in ctx.stats.seqs:
            ranks[boot].append(rank)
        multi = {b: sorted(r) for b, r in ranks.items() if len(r) > 1}
        if not multi:
            incomplete = ctx.stats.incomplete()
            if incomplete is not None:
                return _v(Status.UNDECIDED, incomplete[1], incomplete[0])
            if self.claim.allow_vacuous:
                return _v(
                    Status.PASS,
                    "vacuous pass (allowed by the spec): every boot has one rank",
                    "vacuous",
                )
            return _v(
                Status.UNDECIDED,
                "every boot in the log has a single rank: there is nothing to agree with",
                "single_rank",
            )
        gated = self.gate(ctx, self.decisions > 0, "no decision receipts to compare")
        if gated:
            return gated
        compared, differ = 0, []
        for boot, rs in sorted(multi.items()):
            last = min(self.top_iter.get((boot, r), -1) for r in rs)
            per_rank = [self.digest.get((boot, r), {}) for r in rs]
            # an iteration past a rank's last receipt has nothing from that rank to compare
            for it in sorted({i for d in per_rank for i in d if i <= last}):
                compared += 1
                got = [d.get(it, 0) for d in per_rank]
                if len(set(got)) > 1:
                    counts = ", ".join(f"rank {r}: {g >> 64}" for r, g in zip(rs, got))
                    differ.append(f"boot {boot} iter {it} ({counts} decisions)")
        nums = {
            "iterations": compared,
            "differ": len(differ),
            "ranks": sum(len(r) for r in multi.values()),
        }
        if differ:
            return _v(
                Status.FAIL,
                f"{len(differ)} of {compared} iterations decided differently across ranks; first: {differ[0]}",
                **nums,
            )
        if not compared:
            return _v(
                Status.UNDECIDED, "no iteration was reached by every rank", "no_engagement", **nums
            )
        fields = ", ".join(self.claim.fields)
        return _v(
            Status.PASS,
            f"all ranks made the same decisions ({fields}) in each of {compared} iterations",
            **nums,
        )


def _frozen(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    return v


_CHECKERS: dict[str, type[Checker]] = {
    "engaged": Engaged,
    "never": Never,
    "every": Every,
    "ratio": Derived,
    "compare": Derived,
    "control": Derived,
    "invariant": Invariant,
    "ranks_agree": RanksAgree,
}


def build_checker(claim: Claim, bus: Bus) -> Checker:
    return _CHECKERS[claim.kind](claim, bus)
