"""The ``across_boots`` claim kind: what one boot leaves behind, the next boot finds. Each key
with a ``when`` record in a boot, not closed there after it (a ``closes`` record of that key at
a higher seq), has a ``then`` record in the boot that follows it; boots follow each other in
the order they started (their ``boot.start``'s ``ts``), so a window is a sequence of boot logs
given together, in any order. A key owed by the last boot is UNDECIDED (no boot after it is in
the window); one the next boot does not have is a FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audit.checker import Bus, Checker, Context, name_some, outcome
from audit.kinds.base import ClaimKind
from audit.model import Claim, ReceiptSel
from audit.parse_select import Events, err, field, selectors
from audit.status import ClaimVerdict, Status
from engine.observability import schema


@dataclass(slots=True, frozen=True, kw_only=True)
class AcrossClaim(Claim):
    when: tuple[ReceiptSel, ...]
    then: tuple[ReceiptSel, ...]
    closes: tuple[ReceiptSel, ...] = ()
    key: str = "id"


def parse(t: dict[str, Any], where: str, head: Claim, events: Events) -> AcrossClaim:
    if "when" not in t or "then" not in t:
        raise err(where, "needs 'when' and 'then'")
    key = t.get("key", "id")
    roles = {}
    for role in ("when", "then", "closes"):
        given = t.get(role, [])
        roles[role] = (
            selectors(given, f"{where} {role}", receipts_only=True, events=events)
            if given != []
            else ()
        )
        for s in roles[role]:
            field(s, key, f"{where} key")
    return AcrossClaim(**head.common(), key=key, **roles)


class Across(Checker[AcrossClaim]):
    def __init__(self, claim: AcrossClaim, bus: Bus) -> None:
        super().__init__(claim, bus)
        self.starts: dict[str, float] = {}  # boot -> when it started
        # boot -> key -> highest seq, per role
        self.seen: dict[str, dict[str, dict[Any, int]]] = {"when": {}, "then": {}, "closes": {}}
        bus.kinds[schema.BOOT_START].append(self._start)
        for role in self.seen:
            for sel in getattr(claim, role):
                bus.subscribe(sel, lambda rec, r=role, s=sel: self._mark(r, s, rec))

    def _start(self, rec: dict[str, Any]) -> None:
        """A boot's start time: its ``ts`` where it is a number, else 0 (as one without)."""
        ts = rec.get("ts")
        number = isinstance(ts, int | float) and not isinstance(ts, bool)
        self.starts.setdefault(rec["boot"], float(ts) if number else 0.0)

    def _mark(self, role: str, sel: ReceiptSel, rec: dict[str, Any]) -> None:
        key = rec.get(self.claim.key)
        if key is None or isinstance(key, list | dict) or not sel.matches(rec):
            return
        table = self.seen[role].setdefault(rec["boot"], {})
        table[key] = max(table.get(key, 0), rec["seq"])

    def _owed(self) -> list[tuple[str, list[Any]]]:
        """Per boot, in start order: the keys it leaves for the next boot to find."""
        boots = sorted(
            set(self.starts) | set(self.seen["when"]), key=lambda b: (self.starts.get(b, 0.0), b)
        )
        out = []
        for boot in boots:
            closed = self.seen["closes"].get(boot, {})
            keys = [k for k, a in self.seen["when"].get(boot, {}).items() if closed.get(k, 0) <= a]
            out.append((boot, sorted(keys, key=str)))
        return out

    def decide(self, ctx: Context) -> ClaimVerdict:
        c = self.claim
        when = " | ".join(s.describe() for s in c.when)
        then = " | ".join(s.describe() for s in c.then)
        owed = self._owed()
        total = sum(len(keys) for _, keys in owed)
        missing, waiting = [], []
        for i, (boot, keys) in enumerate(owed):
            if i + 1 == len(owed):
                waiting += [f"{k} (boot {boot})" for k in keys]
                continue
            found = self.seen["then"].get(owed[i + 1][0], {})
            missing += [f"{k} (boot {boot})" for k in keys if k not in found]
        gated = self.gate(
            ctx,
            total > 0,
            f"no {when} left open by a boot: nothing to carry",
            failing=bool(missing),
        )
        if gated:
            gated.numbers.update(keys=total, boots=len(owed))
            return gated
        nums = {"keys": total, "boots": len(owed), "missing": len(missing), "open": len(waiting)}
        if missing:
            return outcome(
                Status.FAIL,
                f"{len(missing)} of {total} {c.key}s from {when} were not found by the next boot's "
                f"{then}: {name_some(missing)}",
                missing_keys=missing[:50],
                **nums,
            )
        if waiting:
            return outcome(
                Status.UNDECIDED,
                f"{len(waiting)} {c.key}s from {when} in the last boot of the window have no boot "
                f"after them to be found by: {name_some(waiting)}",
                "no_later_boot",
                **nums,
            )
        return outcome(
            Status.PASS,
            f"all {total} {c.key}s from {when} were found by the next boot's {then}",
            **nums,
        )


KINDS = (
    ClaimKind(
        "across_boots", frozenset({"when", "then", "closes", "key"}), parse, Across, can_fail=True
    ),
)
