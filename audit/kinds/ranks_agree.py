"""The ``ranks_agree`` claim kind: per (boot, iteration), every rank of the boot made the same
decisions (the selected receipts' fields, as an order-free multiset). A boot's rank count is what
its ``boot.start`` declares (``audit.boot_ranks``).

What it decides, boot by boot (ranks are compared only within their boot):
- an iteration at which the ranks' decisions differ is a FAIL naming the boot, the iteration, and
  each rank's decisions (a single decision is shown with its fields: two digests side by side);
- a rank with no selected receipt at an iteration where another rank has one, while its own log
  goes on past that iteration (a complete log, by seq), decided differently: a FAIL ("no
  receipt"). Where its log ended before that iteration (the rank stopped, died, or its file was
  cut) nothing can be said of it: UNDECIDED (``rank_log_ended``);
- a rank the boot declared and no log holds: UNDECIDED (``rank_missing``), even where the claim
  allows a vacuous pass (a missing log is not a single-rank boot);
- every boot with one rank: UNDECIDED (``single_rank``), or a vacuous PASS where allowed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from audit.boot_ranks import WorldSize
from audit.checker import Bus, Checker, Context, name_some, outcome
from audit.kinds.base import ClaimKind, select
from audit.model import Claim, ReceiptSel
from audit.parse_select import Events, err, field
from audit.status import ClaimVerdict, Status

_MASK64 = (1 << 64) - 1
_DECISION = 1 << 128 | 1 << 63  # one decision more in a digest sum, its hash made >= 0
_SHOWN = 40  # characters of a long list's elements in a sentence


@dataclass(slots=True, frozen=True, kw_only=True)
class RanksAgreeClaim(Claim):
    select: tuple[ReceiptSel, ...]  # receipts only: text lines carry no iteration
    fields: tuple[str, ...]  # the decision each selected receipt stands for


def parse(t: dict[str, Any], where: str, head: Claim, events: Events) -> RanksAgreeClaim:
    sel = select(t, where, events)
    fields = t.get("fields", ["rid"])
    if not isinstance(fields, list) or not fields:
        raise err(where, "'fields' is a non-empty list of field names")
    for s in sel:
        if s.event is not None:
            raise err(
                where,
                f"{s.kind!r} is a text event: ranks agree per iteration, which only receipts carry",
            )
        for f in fields:
            field(s, f, f"{where} fields")
    return RanksAgreeClaim(**head.common(), select=sel, fields=tuple(fields))


def _hashed(raw: tuple) -> int:
    try:
        return hash(raw)
    except TypeError:  # a list or an object among the fields: hashed by value
        return hash(tuple(_frozen(x) for x in raw))


def _frozen(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    return v


class RanksAgree(Checker[RanksAgreeClaim]):
    """Per (boot, iteration), every rank of the boot made the same decisions: the selected
    receipts' fields, as an order-free multiset."""

    def __init__(self, claim: RanksAgreeClaim, bus: Bus) -> None:
        super().__init__(claim, bus)
        # (boot, rank) -> iter -> its decisions: one decision as read, (kind, *fields), so a
        # FAIL can show it; more than one as the sum of (hash + _DECISION) over them: the count
        # above bit 128, below it the hashes (each in [0, 2^64) once shifted), one add each
        self.digest: dict[tuple[str, int], dict[int, Any]] = {}
        # (boot, rank)s whose decisions are not kept: their boot.start said one rank (or none),
        # so there is nothing to compare them with, unless another rank turns up (then the logs
        # are read again keeping every digest: ``rescan``); ``unkept``, those that decided
        self.lazy: set[tuple[str, int]] = set()
        self.unkept: set[tuple[str, int]] = set()
        self.keep_all = bus.exact
        self.world = WorldSize(bus)
        self._last: list[Any] = [None, None, None]  # boot, rank, what _table said of it
        for s in claim.select:
            bus.subscribe(s, self._fn(s))

    def _table(self, boot: str, rank: int) -> dict[int, Any] | bool | None:
        """Where a (boot, rank)'s decisions go: its digests; False where they are not kept and
        none was seen yet; None where they are not kept and one was (``unkept``)."""
        at = (boot, rank)
        per_iter: dict[int, Any] | bool | None = self.digest.get(at)
        if per_iter is None:
            if at in self.unkept:
                per_iter = None
            elif at in self.lazy:
                per_iter = False
            elif not self.keep_all and self.world.one_rank(boot):
                self.lazy.add(at)
                per_iter = False
            else:
                per_iter = self.digest[at] = {}
        self._last[:] = boot, rank, per_iter
        return per_iter

    def rescan(self, ctx: Context) -> bool:
        """Whether a boot whose decisions were not kept turned out to have more than one rank
        (a boot.start that said one, and another rank's log): its digests are needed."""
        ranks = Counter(b for b, _ in ctx.stats.seqs)
        return any(ranks[b] > 1 for b, _ in self.unkept)

    def _fn(self, s: ReceiptSel) -> Callable[[dict[str, Any]], None]:
        fields, last, where = self.claim.fields, self._last, bool(s.where)
        one = fields[0] if len(fields) == 1 else None
        kind = s.kind  # every record this selector gets is of this kind (no text events here)

        def fn(rec: dict[str, Any]) -> None:
            boot, rank, per_iter = last
            if rec["rank"] != rank or rec["boot"] != boot:  # lines of one rank come in runs
                per_iter = self._table(rec["boot"], rec["rank"])
            if per_iter is None:  # not kept, and a decision of this (boot, rank) was seen
                return
            it = rec.get("iter")
            if type(it) is not int or (where and not s.matches(rec)):
                return
            if per_iter is False:  # not kept: that it decided is all that is needed of it
                self.unkept.add((rec["boot"], rec["rank"]))
                last[2] = None
                return
            raw = (kind, rec.get(one)) if one is not None else (kind, *map(rec.get, fields))
            old = per_iter.get(it)
            if old is None:
                per_iter[it] = raw
            elif type(old) is tuple:
                per_iter[it] = _hashed(old) + _hashed(raw) + 2 * _DECISION
            else:
                per_iter[it] = old + _hashed(raw) + _DECISION

        return fn

    def _digests(self, boot: str, rank: int) -> dict[int, Any]:
        """iter -> one decision as read, or count << 64 | (sum of hashes mod 2^64, shifted)."""
        got = self.digest.get((boot, rank), {})
        return {
            it: d if type(d) is tuple else (d >> 128) << 64 | d & _MASK64 for it, d in got.items()
        }

    def _shown(self, d: Any) -> str:
        """A rank's decisions at one iteration, for a sentence."""
        if d is None:
            return "no receipt"
        if type(d) is not tuple:
            return f"{d >> 64} decisions"
        values = ", ".join(f"{f} {_value(v)}" for f, v in zip(self.claim.fields, d[1:]))
        return f"{d[0]} {values}"

    def _compare(
        self, ctx: Context, multi: dict[str, list[int]]
    ) -> tuple[int, list[str], list[str]]:
        """(iterations compared, where ranks differ, where a rank's log had ended)."""
        compared, differ, ended = 0, [], []
        for boot, rs in sorted(multi.items()):
            top = {r: ctx.stats.seqs[(boot, r)].top_iter for r in rs}
            per_rank = {r: self._digests(boot, r) for r in rs}
            for it in sorted({i for d in per_rank.values() for i in d}):
                present = [r for r in rs if top[r] >= it]  # logs that reach this iteration
                gone = [r for r in rs if top[r] < it]
                if gone:
                    last = ", ".join(f"rank {r} at iter {top[r]}" for r in gone)
                    ended.append(f"boot {boot} iter {it} (the log of {last} ended before it)")
                if len(present) < 2:
                    continue
                compared += 1
                got = [per_rank[r].get(it) for r in present]
                if any(g != got[0] for g in got[1:]):
                    each = ", ".join(f"rank {r}: {self._shown(g)}" for r, g in zip(present, got))
                    differ.append(f"boot {boot} iter {it} ({each})")
        return compared, differ, ended

    def decide(self, ctx: Context) -> ClaimVerdict:
        ranks: dict[str, list[int]] = defaultdict(list)
        for boot, rank in ctx.stats.seqs:
            ranks[boot].append(rank)
        multi = {b: sorted(r) for b, r in ranks.items() if len(r) > 1}
        missing = self.world.missing(ranks)
        if not multi and not missing:
            return self._single_rank(ctx)
        gated = self.gate(ctx, True, "", failing=True)  # an incomplete log only
        if gated:
            return gated
        compared, differ, ended = self._compare(ctx, multi)
        nums = {
            "iterations": compared,
            "differ": len(differ),
            "ranks": sum(len(r) for r in ranks.values()),
            "ranks_missing": sum(k for _, _, k, _ in missing),
            "unmatched": len(ended),
        }
        if differ:
            return outcome(
                Status.FAIL,
                f"{len(differ)} of {compared} iterations decided differently across ranks; "
                f"first: {differ[0]}",
                **nums,
            )
        gated = self.gate(ctx, True, "")  # what the claim requires unseen
        if gated:
            gated.numbers.update(nums)
            return gated
        if missing:
            return _rank_missing(missing, nums, self.world)
        decided = bool(self.unkept) or any(self.digest.values())
        gated = self.gate(ctx, decided, "no decision receipts to compare")
        if gated:
            gated.numbers.update(nums)
            return gated
        if ended:
            return outcome(
                Status.UNDECIDED,
                f"{len(ended)} iteration(s) with decisions after a rank's log ended (it "
                f"stopped, died, or its file was cut): {name_some(ended)}",
                "rank_log_ended",
                **nums,
            )
        if not compared:
            return outcome(
                Status.UNDECIDED, "no iteration was reached by every rank", "no_engagement", **nums
            )
        fields = ", ".join(self.claim.fields)
        return outcome(
            Status.PASS,
            f"all ranks made the same decisions ({fields}) in each of {compared} iterations",
            **nums,
        )

    def _single_rank(self, ctx: Context) -> ClaimVerdict:
        incomplete = ctx.stats.incomplete()
        if incomplete is not None:
            return outcome(Status.UNDECIDED, incomplete[1], incomplete[0])
        if self.claim.allow_vacuous:
            return outcome(
                Status.PASS,
                "vacuous pass (allowed by the spec): every boot has one rank",
                "vacuous",
            )
        return outcome(
            Status.UNDECIDED,
            "every boot in the log has a single rank: there is nothing to agree with",
            "single_rank",
        )


def _rank_missing(
    missing: list[tuple[str, list[int], int, int]], nums: dict[str, int], world: WorldSize
) -> ClaimVerdict:
    """UNDECIDED: boots that declare ranks no log holds (``WorldSize.missing``)."""
    shown = [
        f"boot {b} says {n} ranks ({world.source(b)}), no log "
        f"holds rank {', '.join(map(str, a))}" + (f" and {k - len(a)} more" if k > len(a) else "")
        for b, a, k, n in missing
    ]
    return outcome(
        Status.UNDECIDED,
        f"{name_some(shown)}: a rank log is missing (pass every rank's log: a directory "
        "or a glob), so agreement cannot be judged",
        "rank_missing",
        **nums,
    )


def _value(v: Any) -> str:
    """A field's value in a sentence, whole: cut at a width, two values that differ late read
    as one. A long list shows its first elements whole and how many more it holds."""
    if not isinstance(v, list) or len(repr(v)) <= _SHOWN:
        return repr(v)
    kept: list[str] = []
    size = 0
    for x in v:
        size += len(repr(x)) + 2
        if kept and size > _SHOWN:
            break
        kept.append(repr(x))
    return f"[{', '.join(kept)}, ... ({len(v) - len(kept)} more)]"


KINDS = (
    ClaimKind("ranks_agree", frozenset({"select", "fields"}), parse, RanksAgree, can_fail=True),
)
