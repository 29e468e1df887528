"""The claim kinds that read receipts one by one (``engaged``, ``never``, ``every``,
``invariant``), and ``build_checker``, which picks the checker for a claim's kind (the
derived-number kinds are in ``audit.derived``, ``final`` in ``audit.final``, ``ranks_agree`` in
``audit.ranks``).

Each checker subscribes to the receipts and text lines its selectors scope, keeps the least state
its question needs, and gives one verdict at the end, through the gates of ``audit.checker``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from audit import expr
from audit.checker import Bus, Checker, Context, SelCount, locate, name_some, outcome
from audit.derived import Derived
from audit.final import Final
from audit.foreign import TEXT_BOOT
from audit.lastseq import highest
from audit.model import Claim, ReceiptSel
from audit.ranks import RanksAgree
from audit.status import ClaimVerdict, Status
from engine.obs import schema


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
        return outcome(
            Status.PASS, f"{n} {desc} seen (>= {need}); first: {self.sel.first}", seen=n, min=need
        )


class Never(Checker):
    def __init__(self, claim: Claim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.sel = SelCount(claim.select, bus)

    def decide(self, ctx: Context) -> ClaimVerdict:
        n = self.sel.count
        if n:
            return outcome(
                Status.FAIL, f"{n} x {self.sel.describe()}; first: {self.sel.first}", found=n
            )
        gated = self.gate(ctx, True, "")
        if gated:
            gated.numbers.update(found=0)
            return gated
        st = ctx.stats
        return outcome(
            Status.PASS,
            f"none of {self.sel.describe()} in {st.receipts} receipts and {st.text + st.foreign_json} "
            f"text lines ({self.requires.describe()} seen {self.requires.count})",
            found=0,
        )


class Every(Checker):
    """Each key with a `when` receipt has a `then` receipt at a higher seq on the same rank,
    before the key's window closes: at a `closes` receipt of that key (for request keys, by
    default, the request's finish, abort or reject) or at boot.stop. A window that closed without
    the follow-up is a FAIL, boot.stop or not; one still open where the log ends is UNDECIDED."""

    def __init__(self, claim: Claim, bus: Bus) -> None:
        super().__init__(claim, bus)
        # each role's records: per (boot, rank), each key's highest seq (the state that grows
        # with the number of requests, shared with every claim that reads the same)
        self.when = [bus.last_seq(s, claim.when_key) for s in claim.when]
        self.then = [bus.last_seq(s, claim.then_key) for s in claim.then]
        self.closes = [bus.last_seq(s, claim.close_key) for s in claim.closes]
        self.stops: dict[tuple[str, int], int] = {}
        bus.kinds[schema.BOOT_STOP].append(self._stop)
        for s in claim.stops:
            bus.subscribe(s, lambda rec, s=s: self._stop(rec) if s.matches(rec) else None)

    def _stop(self, rec: dict[str, Any]) -> None:
        key = (rec["boot"], rec["rank"])
        self.stops[key] = max(self.stops.get(key, 0), rec["seq"])

    def _line(self, k: Any, seq: int) -> str | None:
        """Where the text line of a key's `when` at ``seq`` is."""
        return next(
            (w.where.get(k) for w in self.when if w.tables.get((TEXT_BOOT, 0), {}).get(k) == seq),
            None,
        )

    def _windows(self, opened: str) -> tuple[int, list[tuple[str, str]], list[str]]:
        """(keys with a `when`, [(key, how its window closed)] without a follow-up, open keys);
        ``opened``: what to call the `when` receipt in a sentence."""
        total, failed, open_ = 0, [], []
        ended = "the run ended" if self.claim.stops else "boot.stop"
        for at in sorted({at for w in self.when for at in w.tables}):
            boot, rank = at
            stop = self.stops.get(at, 0)
            thens = [t for i in self.then if (t := i.tables.get(at))]
            closes = [t for i in self.closes if (t := i.tables.get(at))]
            whens = highest([t for i in self.when if (t := i.tables.get(at)) is not None])
            total += len(whens)
            late: Any = whens.items()  # the keys no `then` followed (yet), table by table
            for t in thens:
                late = [(k, a) for k, a in late if t.get(k, 0) <= a]
            for k, a in late:
                c = max((t.get(k, 0) for t in closes), default=0)
                name, seen, closed = f"{k} (rank {rank})", f"seq {a}", f" at seq {c}"
                if boot == TEXT_BOOT:  # a text line is named by its place in the file
                    name, seen, closed = f"{self.claim.when_key} {k!r}", self._line(k, a), " later"
                    stop_at = f"{ended} later"
                else:
                    stop_at = f"{ended} at seq {stop}"
                if c > a:
                    failed.append((name, f"{opened} at {seen}, its window closed{closed}"))
                elif stop > a:
                    failed.append((name, f"{opened} at {seen}, {stop_at}"))
                else:
                    open_.append(name)
        return total, sorted(failed), sorted(open_)

    def _ends(self) -> str:
        """What closes a window, for a sentence."""
        ends = [s.describe() for s in (*self.claim.closes, *self.claim.stops)]
        if self.claim.when[0].event is None:
            ends.append("boot.stop")
        return " or ".join(ends)

    def decide(self, ctx: Context) -> ClaimVerdict:
        c = self.claim
        when = " | ".join(s.describe() for s in c.when)
        label = "rid" if c.when_key in ("rid", "rids") else c.when_key
        then = " | ".join(s.describe() for s in c.then)
        total, failed, open_ = self._windows(c.when[0].kind if len(c.when) == 1 else "when")
        gated = self.gate(ctx, total > 0, f"no {when} seen: nothing to follow")
        nums = {"keys": total, "failed": len(failed), "open": len(open_)}
        if gated:
            gated.numbers.update(nums)
            return gated
        if failed:
            names = [name for name, _ in failed]
            return outcome(
                Status.FAIL,
                f"{len(failed)} of {total} {label}s from {when} had no later {then} before their "
                f"window closed (at {self._ends()}): {name_some(names)}; "
                f"first: {names[0]}: {failed[0][1]}",
                failed_keys=names[:50],
                **nums,
            )
        if open_:
            return outcome(
                Status.UNDECIDED,
                f"{len(open_)} of {total} {label}s from {when} are still open where the log "
                f"ends and nothing ended the run after them ({self._ends()}; still running, or "
                f"the log was cut): {name_some(open_)}",
                "in_flight_at_end",
                open_keys=open_[:50],
                **nums,
            )
        return outcome(Status.PASS, f"all {total} {label}s from {when} later had {then}", **nums)


class Invariant(Checker):
    """A relation on the fields of each matching receipt."""

    def __init__(self, claim: Claim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.checked = self.broken = self.unevaluable = 0
        self.first_broken: str | None = None
        self.first_missing: str | None = None
        for s in claim.select:
            bus.subscribe(s, self._fn(s))

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
                    self.first_missing = f"{locate(rec)} has no {e.name}"
                return
            except (TypeError, expr.ZeroDivision):
                self.unevaluable += 1
                if self.first_missing is None:
                    self.first_missing = f"{locate(rec)}: {check.source} cannot be evaluated"
                return
            self.checked += 1
            if not ok:
                self.broken += 1
                if self.first_broken is None:
                    self.first_broken = f"{locate(rec)}: {check.source}: {check.shown(rec)}"

        return fn

    def decide(self, ctx: Context) -> ClaimVerdict:
        c = self.claim
        nums = {"checked": self.checked, "broken": self.broken, "unevaluable": self.unevaluable}
        if self.broken:
            return outcome(
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
            return outcome(
                Status.UNDECIDED,
                f"{self.unevaluable} receipt(s) cannot be checked; first: {self.first_missing}",
                "missing_field",
                **nums,
            )
        return outcome(
            Status.PASS, f"{c.check.source} holds in all {self.checked} {sel} receipts", **nums
        )


_CHECKERS: dict[str, type[Checker]] = {
    "engaged": Engaged,
    "never": Never,
    "every": Every,
    "ratio": Derived,
    "compare": Derived,
    "control": Derived,
    "invariant": Invariant,
    "ranks_agree": RanksAgree,
    "final": Final,
}


def build_checker(claim: Claim, bus: Bus) -> Checker:
    return _CHECKERS[claim.kind](claim, bus)
