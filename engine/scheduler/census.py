"""The census a cutover takes before and after it: who is running, parked and waiting, and the
backlog of prompt tokens not yet prefilled, each request counted once.

A request in two states at once (or listed twice in one) is an invariant violation the census
reports (``doubled``); the backlog never counts it twice, whatever lists it sits in. A request
that has generated tokens owes no backlog: what it recomputes after a carry put it back in line
is not new work.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from engine.scheduler.request import Request, State


@dataclass(frozen=True, slots=True)
class Census:
    running: tuple[str, ...]
    parked: tuple[str, ...]
    waiting: tuple[str, ...]
    backlog: int

    def rids(self) -> list[str]:
        """Every rid of the census, once each, sorted."""
        return sorted({*self.running, *self.parked, *self.waiting})

    def doubled(self) -> list[str]:
        """Rids listed more than once (in two states, or twice in one)."""
        seen = Counter((*self.running, *self.parked, *self.waiting))
        return sorted(rid for rid, n in seen.items() if n > 1)

    def fields(self, suffix: str = "") -> dict[str, object]:
        """The receipt fields (``suffix``: ``_before`` for the census an end repeats)."""
        f = {
            "running": list(self.running),
            "parked": list(self.parked),
            "waiting": list(self.waiting),
            "rids": self.rids(),
            "backlog": self.backlog,
        }
        return {k + suffix: v for k, v in f.items()}


def pending_prefill(req: Request) -> int:
    """Prompt tokens ``req`` has not prefilled yet (none once it has generated); positions
    planned ahead (overlap) hold slots but are not prefilled until their step runs."""
    return 0 if req.output_ids else max(0, req.prompt_len - (req.kv_len - req.ahead))


def backlog(*groups: Iterable[Request]) -> int:
    """Pending prefill tokens over ``groups``, each request counted once however many of the
    groups hold it."""
    once = {r.rid: r for group in groups for r in group}
    return sum(pending_prefill(r) for r in once.values())


def take_census(running: Iterable[Request], waiting: Iterable[Request]) -> Census:
    """The census of a scheduler's resident set (``running``, parked ones included) and line."""
    running, waiting = list(running), list(waiting)
    return Census(
        running=tuple(r.rid for r in running if r.state is not State.PARKED),
        parked=tuple(r.rid for r in running if r.state is State.PARKED),
        waiting=tuple(r.rid for r in waiting),
        backlog=backlog(running, waiting),
    )
