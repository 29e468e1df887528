"""The ``final`` claim kind: how the run left things. The last record of each key (the queue depth
an engine last reported, per rank) satisfies a relation on its fields, once the run is known to
have ended after it.

The end of the run is boot.stop on the record's (boot, rank), or any of the claim's ``stops`` (a
server's shutdown line, for a text log). A last record with no end after it is not known to be
the last: the engine may still be running, or the log was cut (UNDECIDED, ``in_flight_at_end``).
In a live window (``audit.live``) the window's end stands for it: a last value that holds there
passes as of there, one that does not stays UNDECIDED (the run goes on after the window).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from audit import expr
from audit.checker import Bus, Checker, Context, locate, name_some, outcome
from audit.kinds.base import ClaimKind, record_check, select, stops
from audit.model import Claim, ReceiptSel
from audit.parse_select import Events, err, field, known_fields, one_stream
from audit.status import ClaimVerdict, Status
from engine.observability import schema


@dataclass(slots=True, frozen=True, kw_only=True)
class FinalClaim(Claim):
    select: tuple[ReceiptSel, ...]
    key: str | None = None  # the last record of each key is checked (one key without it)
    check: expr.Expr  # over that record's fields
    stops: tuple[ReceiptSel, ...] = ()  # records that end the run, as boot.stop ends a rank's


def parse(t: dict[str, Any], where: str, head: Claim, events: Events) -> FinalClaim:
    sel = select(t, where, events)
    key = t.get("key")
    if key is not None:  # a field some selected kind carries; the records without it share one key
        if not isinstance(key, str):
            raise err(where, "'key' is a field name")
        if not any(key in known_fields(s) for s in sel):
            field(sel[0], key, f"{where} key")
    check = record_check(t, where, sel)
    ends = stops(t, where, events)
    one_stream((*sel, *ends), where)
    return FinalClaim(**head.common(), select=sel, key=key, check=check, stops=ends)


class Final(Checker[FinalClaim]):
    """`check` on the last record of each key (one key without ``key``), once the run ended."""

    def __init__(self, claim: FinalClaim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.last: dict[tuple[str, int, Any], dict[str, Any]] = {}  # (boot, rank, key) -> record
        self.ends: dict[tuple[str, int], int] = {}  # (boot, rank) -> seq of the last end
        for s in claim.select:
            bus.subscribe(s, self._fn(s))
        for s in claim.stops:
            bus.subscribe(s, lambda rec, s=s: self._end(rec) if s.matches(rec) else None)
        bus.kinds[schema.BOOT_STOP].append(self._end)

    def _fn(self, s: ReceiptSel) -> Callable[[dict[str, Any]], None]:
        key = self.claim.key

        def fn(rec: dict[str, Any]) -> None:
            if s.where and not s.matches(rec):
                return
            k = None if key is None else rec.get(key)
            at = (
                rec["boot"],
                rec["rank"],
                k if k is None or isinstance(k, str | int | float) else repr(k),
            )
            held = self.last.get(at)
            if held is None or rec["seq"] > held["seq"]:
                self.last[at] = rec

        return fn

    def _end(self, rec: dict[str, Any]) -> None:
        at = (rec["boot"], rec["rank"])
        self.ends[at] = max(self.ends.get(at, 0), rec["seq"])

    def _name(self, at: tuple[str, int, Any]) -> str:
        if self.claim.key is None:
            return "the last"
        return f"no {self.claim.key}" if at[2] is None else f"{self.claim.key} {at[2]!r}"

    def _read(self, ctx: Context) -> tuple[list[str], list[str], list[str]]:
        """The last records that break the check once the run ended after them, those not known
        to be final, and those it cannot be evaluated on."""
        c = self.claim
        broken, open_, missing = [], [], []
        for at, rec in sorted(self.last.items(), key=lambda kv: repr(kv[0])):
            ended = self.ends.get(at[:2], 0) > rec["seq"]
            if not ended and not ctx.live:
                open_.append(self._name(at))
                continue
            try:
                ok = c.check(rec)
            except (expr.Missing, expr.ZeroDivision, TypeError):
                missing.append(f"{self._name(at)}: {locate(rec)}")
                continue
            if not ok and not ended:  # a live window's last value: it may hold yet
                open_.append(self._name(at))
            elif not ok:
                broken.append(f"{self._name(at)}: {locate(rec)}: {c.check.shown(rec)}")
        return broken, open_, missing

    def decide(self, ctx: Context) -> ClaimVerdict:
        c = self.claim
        sel = " | ".join(s.describe() for s in c.select)
        broken, open_, missing = self._read(ctx)
        gated = self.gate(
            ctx, bool(self.last), f"no {sel} seen: nothing was last", failing=bool(broken)
        )
        if gated:
            gated.numbers.update(keys=len(self.last))
            return gated
        nums = {"keys": len(self.last), "broken": len(broken), "open": len(open_)}
        if broken:
            return outcome(
                Status.FAIL,
                f"{c.check.source} does not hold in {len(broken)} of {len(self.last)} last "
                f"{sel} (the run ended after them); first: {broken[0]}",
                **nums,
            )
        if open_:
            why = (
                f"{c.check.source} does not hold on the last {sel} of {name_some(open_)} where "
                "the live window ends, and the run goes on after it"
                if ctx.live
                else f"nothing ended the run after the last {sel} of {name_some(open_)} (still "
                "running, or the log was cut)"
            )
            why += ": a last value read is not known to be final"
            return outcome(Status.UNDECIDED, why, "in_flight_at_end", **nums)
        if missing:
            return outcome(
                Status.UNDECIDED,
                f"{c.check.source} cannot be evaluated on {missing[0]}",
                "missing_field",
                **nums,
            )
        ended = (
            "the live window ends after them or there" if ctx.live else "the run ended after them"
        )
        return outcome(
            Status.PASS,
            f"{c.check.source} holds in the last {sel} of all {len(self.last)} key(s), and {ended}",
            **nums,
        )


_KEYS = frozenset({"select", "key", "check", "stops"})
KINDS = (ClaimKind("final", _KEYS, parse, Final, can_fail=True),)
