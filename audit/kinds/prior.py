"""The ``prior`` claim kind: each selected record checked against what came before it on the same
(boot, rank), and the same ``key`` where one is named: running sums of a field over earlier
records (``sum``), and the fields of the last earlier record of a kind (``last``, read as
``NAME.field``).

A cutover's end against its own begin (``key = "id"``, ``last = { begin = ... }``); a load from
the host tier against what was spilled there less what was dropped (``sum``). "Earlier" is a
lower ``seq``: the records are ordered by seq when the log has been read, so no verdict depends
on the order in which lines or files were read. A record that a sum or ``last`` also selects is
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


class Prior(Checker[PriorClaim]):
    def __init__(self, claim: PriorClaim, bus: Bus) -> None:
        super().__init__(claim, bus)
        # per (boot, rank): (seq, 0 checked | 1 remembered, name, key value, record or value)
        self.seen: dict[tuple[str, int], list[tuple[int, int, str, Any, Any]]] = defaultdict(list)
        for s in claim.select:
            bus.subscribe(s, self._fn(s, 0, "", None))
        for n, sm in claim.sums.items():
            for s in sm.select:
                bus.subscribe(s, self._fn(s, 1, n, sm.field))
        for n, sels in claim.last.items():
            for s in sels:
                bus.subscribe(s, self._fn(s, 1, n, None))
        self.checked = self.broken = self.unevaluable = 0
        self.first_broken: str | None = None
        self.first_missing: str | None = None

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
            self.seen[(rec["boot"], rec["rank"])].append((rec["seq"], order, name, k, item))

        return fn

    def _run(self) -> None:
        """Every selected record against the state before it, in seq order (once)."""
        c = self.claim
        for at in sorted(self.seen):
            sums: dict[Any, dict[str, float]] = defaultdict(lambda: dict.fromkeys(c.sums, 0))
            last: dict[Any, dict[str, dict[str, Any]]] = defaultdict(dict)
            for _, order, name, k, item in sorted(self.seen[at], key=lambda e: e[:2]):
                if order == 1 and isinstance(k, list | dict):
                    continue  # a key is one value
                if order == 1 and name in c.sums:
                    sums[k][name] += item
                elif order == 1:
                    last[k][name] = item
                else:
                    self._check(item, k, sums[k], last[k])
        self.seen.clear()

    def _check(
        self, rec: dict[str, Any], k: Any, sums: dict[str, float], last: dict[str, dict[str, Any]]
    ) -> None:
        c = self.claim
        where = locate(rec) + ("" if c.key is None else f" ({c.key} {k})")
        gone = [
            n for n in c.last if n not in last and any(x.startswith(n + ".") for x in c.check.names)
        ]
        if gone or (c.key is not None and (k is None or isinstance(k, list | dict))):
            self.unevaluable += 1
            if self.first_missing is None:
                what = " | ".join(s.describe() for s in c.last[gone[0]]) if gone else f"no {c.key}"
                self.first_missing = f"{where}: no earlier {what}" if gone else f"{where}: {what}"
            return
        env = dict(rec) | sums
        for n, r in last.items():
            env.update({f"{n}.{f}": v for f, v in r.items()})
        try:
            ok = c.check(env)
        except expr.Missing as e:
            self.unevaluable += 1
            self.first_missing = self.first_missing or f"{where} has no {e.name}"
            return
        except (TypeError, expr.ZeroDivision):
            self.unevaluable += 1
            self.first_missing = (
                self.first_missing or f"{where}: {c.check.source} cannot be evaluated"
            )
            return
        self.checked += 1
        if not ok:
            self.broken += 1
            if self.first_broken is None:
                shown = c.check.shown({n: _shown(v) for n, v in env.items()})
                self.first_broken = f"{where}: {c.check.source}: {shown}"

    def decide(self, ctx: Context) -> ClaimVerdict:
        self._run()
        c = self.claim
        nums = {"checked": self.checked, "broken": self.broken, "unevaluable": self.unevaluable}
        sel = " | ".join(s.describe() for s in c.select)
        gated = self.gate(
            ctx, self.checked + self.unevaluable > 0, f"no {sel} seen: nothing to check"
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
