"""The ``prior`` claim kind: each selected record checked against what came before it on the same
(boot, rank), and the same ``key`` where one is named: running sums of a field over earlier
records (``sum``), and the fields of the last earlier record of a kind (``last``, read as
``NAME.field``).

A cutover's end against its own begin (``key = "id"``, ``last = { begin = ... }``); a load from
the host tier against what was spilled there less what was dropped (``sum``). "Earlier" is a
lower ``seq``: a log read in seq order is checked as it is read (holding the sums and the last
records, not the records), and one that is not is read again and ordered by seq, so no verdict
depends on the order in which lines or files were read. A record that a sum or ``last`` also selects is
not before itself. A lost line can move a sum, so an incomplete log is UNDECIDED before anything
is decided.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from audit import expr
from audit.checker import Bus, Checker, Context, locate, outcome
from audit.kinds.base import ClaimKind, expression, select
from audit.kinds.derived import Sum, parse_sums
from audit.model import Claim, ReceiptSel
from audit.parse_select import Events, err, field, known_fields, one_stream, selectors
from audit.status import ClaimVerdict, Status

SHOWN = 6  # list items a sentence shows


@dataclass(slots=True, frozen=True, kw_only=True)
class PriorClaim(Claim):
    select: tuple[ReceiptSel, ...]
    check: expr.Expr  # over the record's fields, the sums and NAME.field of the last records
    key: str | None = None  # sums and last records are per value of this field
    sums: dict[str, Sum]
    last: dict[str, tuple[ReceiptSel, ...]]


def _fields(sels: tuple[ReceiptSel, ...]) -> set[str]:
    return set.intersection(*(set(known_fields(s)) for s in sels))


def parse(t: dict[str, Any], where: str, head: Claim, events: Events) -> PriorClaim:
    sel = select(t, where, events)
    names = _fields(sel)
    sums = parse_sums(t, where, events)
    last = {
        n: selectors(s, f"{where} last.{n}", receipts_only=True, events=events)
        for n, s in t.get("last", {}).items()
    }
    if not sums and not last:
        raise err(where, "needs 'sum' or 'last': what the record is checked against")
    if set(sums) & set(last):
        raise err(where, f"{', '.join(sorted(set(sums) & set(last)))}: a sum and a last record")
    for n in (*sums, *last):
        if n in names:
            raise err(where, f"{n!r} is a field of the selected records: name it otherwise")
    every = (
        *sel,
        *(r for s in sums.values() for r in s.select),
        *(r for s in last.values() for r in s),
    )
    one_stream(every, where)
    key = t.get("key")
    if key is not None:
        for r in every:
            field(r, key, f"{where} key")
    names |= set(sums) | {f"{n}.{f}" for n, s in last.items() for f in _fields(s)}
    if "check" not in t:
        raise err(where, "needs 'check'")
    check = expression(t["check"], f"{where} check", names, comparison=True)
    return PriorClaim(**head.common(), select=sel, check=check, key=key, sums=sums, last=last)


def _shown(v: Any) -> Any:
    """A value for a sentence: a long list cut to its first items."""
    if isinstance(v, list) and len(v) > SHOWN:
        return f"[{', '.join(map(str, v[:SHOWN]))}, ... ({len(v)} items)]"
    return v


class _At:
    """One (boot, rank)'s state: sums and last records per key, what was checked, and where it
    stands in seq order (seq, then checked before remembered)."""

    __slots__ = ("place", "sums", "last", "checked", "broken", "unevaluable", "broke", "missed")

    def __init__(self, sums: dict[str, Sum]) -> None:
        self.place = (-1, 0)
        self.sums: dict[Any, dict[str, float]] = defaultdict(lambda: dict.fromkeys(sums, 0))
        self.last: dict[Any, dict[str, dict[str, Any]]] = defaultdict(dict)
        self.checked = self.broken = self.unevaluable = 0
        self.broke: str | None = None  # the first broken record, described
        self.missed: str | None = None  # the first record that could not be checked


class Prior(Checker[PriorClaim]):
    """Each selected record against the records before it. A log read in seq order (as one rank
    writes it) is checked as it is read, holding only the sums and last records; where a record
    comes before one already read, the logs are read again on an exact bus (``rescan``), which
    holds every selected record and orders them by seq once read."""

    def __init__(self, claim: PriorClaim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.ats: dict[tuple[str, int], _At] = {}
        self.exact, self.disordered = bus.exact, False
        # exact: per (boot, rank), (seq, 0 checked | 1 remembered, name, key value, item)
        self.seen: dict[tuple[str, int], list[tuple[int, int, str, Any, Any]]] = defaultdict(list)
        for s in claim.select:
            bus.subscribe(s, self._fn(s, 0, "", None))
        for n, sm in claim.sums.items():
            for s in sm.select:
                bus.subscribe(s, self._fn(s, 1, n, sm.field))
        for n, sels in claim.last.items():
            for s in sels:
                bus.subscribe(s, self._fn(s, 1, n, None))

    def _fn(
        self, s: ReceiptSel, order: int, name: str, value_of: str | None
    ) -> Callable[[dict[str, Any]], None]:
        key = self.claim.key

        def fn(rec: dict[str, Any]) -> None:
            if s.where and not s.matches(rec):
                return
            k = None if key is None else rec.get(key)
            if value_of is None:
                item: Any = rec
            else:
                item = rec.get(value_of)
                if not isinstance(item, int | float) or isinstance(item, bool):
                    return
            at, place = (rec["boot"], rec["rank"]), (rec["seq"], order)
            if self.exact:
                self.seen[at].append((*place, name, k, item))
                return
            st = self.ats.get(at)
            if st is None:
                st = self.ats[at] = _At(self.claim.sums)
            if place < st.place:  # before what was read: only the exact way can order it
                self.disordered = True
                return
            st.place = place
            self._apply(st, order, name, k, item)

        return fn

    def rescan(self, ctx: Context) -> bool:
        return self.disordered

    def _apply(self, st: _At, order: int, name: str, k: Any, item: Any) -> None:
        """One record: remembered (into a sum or as the last of its name) or checked."""
        if order == 1 and isinstance(k, list | dict):
            return  # a key is one value
        if order == 1 and name in self.claim.sums:
            st.sums[k][name] += item
        elif order == 1:
            st.last[k][name] = item
        else:
            self._check(st, item, k)

    def _run(self) -> tuple[_At, ...]:
        """Each (boot, rank)'s state, in (boot, rank) order; read the exact way, every
        selected record in seq order first (once)."""
        for at in sorted(self.seen):
            st = self.ats[at] = _At(self.claim.sums)
            for _, order, name, k, item in sorted(self.seen[at], key=lambda e: e[:2]):
                self._apply(st, order, name, k, item)
        self.seen.clear()
        return tuple(self.ats[at] for at in sorted(self.ats))

    def _check(self, st: _At, rec: dict[str, Any], k: Any) -> None:
        c = self.claim
        sums, last = st.sums[k], st.last[k]
        where = locate(rec) + ("" if c.key is None else f" ({c.key} {k})")
        gone = [
            n for n in c.last if n not in last and any(x.startswith(n + ".") for x in c.check.names)
        ]
        if gone or (c.key is not None and (k is None or isinstance(k, list | dict))):
            st.unevaluable += 1
            if st.missed is None:
                what = " | ".join(s.describe() for s in c.last[gone[0]]) if gone else f"no {c.key}"
                st.missed = f"{where}: no earlier {what}" if gone else f"{where}: {what}"
            return
        env = dict(rec) | sums
        for n, r in last.items():
            env.update({f"{n}.{f}": v for f, v in r.items()})
        try:
            ok = c.check(env)
        except expr.Missing as e:
            st.unevaluable += 1
            st.missed = st.missed or f"{where} has no {e.name}"
            return
        except (TypeError, expr.ZeroDivision):
            st.unevaluable += 1
            st.missed = st.missed or f"{where}: {c.check.source} cannot be evaluated"
            return
        st.checked += 1
        if not ok:
            st.broken += 1
            if st.broke is None:
                shown = c.check.shown({n: _shown(v) for n, v in env.items()})
                st.broke = f"{where}: {c.check.source}: {shown}"

    def decide(self, ctx: Context) -> ClaimVerdict:
        ats = self._run()
        self.checked = sum(st.checked for st in ats)
        self.broken = sum(st.broken for st in ats)
        self.unevaluable = sum(st.unevaluable for st in ats)
        self.first_broken = next((st.broke for st in ats if st.broke is not None), None)
        self.first_missing = next((st.missed for st in ats if st.missed is not None), None)
        c = self.claim
        nums = {"checked": self.checked, "broken": self.broken, "unevaluable": self.unevaluable}
        sel = " | ".join(s.describe() for s in c.select)
        gated = self.gate(
            ctx,
            self.checked + self.unevaluable > 0,
            f"no {sel} seen: nothing to check",
            failing=self.broken > 0,
        )
        if gated:
            gated.numbers.update(nums)
            return gated
        if self.broken:
            return outcome(
                Status.FAIL,
                f"{self.broken} of {self.checked} {sel} receipts break it; first: {self.first_broken}",
                **nums,
            )
        if self.unevaluable:
            return outcome(
                Status.UNDECIDED,
                f"{self.unevaluable} receipt(s) cannot be checked; first: {self.first_missing}",
                "missing_field",
                **nums,
            )
        per = "its (boot, rank)" + ("" if c.key is None else f" and {c.key}")
        return outcome(
            Status.PASS,
            f"{c.check.source} holds at all {self.checked} {sel} receipts, each against the "
            f"earlier records of {per}",
            **nums,
        )


KINDS = (
    ClaimKind(
        "prior", frozenset({"select", "check", "key", "sum", "last"}), parse, Prior, can_fail=True
    ),
)
