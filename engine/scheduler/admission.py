"""Admission decisions as pure functions over plain numbers (wired in scheduler.py, once).

The round's budget is the local term -- available + evictable - what running decodes will
still need - what this round already took -- bounded by the published floor (minus the same
offset) when the group published one. A chunk takes what that budget funds, up to the nominal
chunk; below one page it parks: zero tokens scheduled, the request kept, retried next round.

The step budget bounds time, not memory: the tokens of one forward (one per decode plus the
prefill chunks) stay within ``step_tokens``. Decodes always run; chunks get what is left, and
the first chunk of a step gets at least ``prefill_floor``: as many tokens as the step decodes
(one page at least), so a prefill keeps pace with the decodes however many there are (the
forward then holds at most twice its decode tokens, a page more with very few).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple

from engine.memory.pages import fresh_pages

# The one request allowed to be mid-prefill beyond --max-running: every check of the running
# ceiling uses this constant, so "max_running + 1" is written in exactly one place.
MAX_INFLIGHT_CHUNKED = 1


def running_ceiling(max_running: int) -> int:
    return max_running + MAX_INFLIGHT_CHUNKED


@dataclass(slots=True)
class Budget:
    """The inputs of one round's admission decisions (they go into the receipts)."""

    local_avail: int  # the allocator's available tokens
    evictable: int  # the prefix cache's evictable tokens
    decode_reserve: int  # tokens running decodes are expected to need (new-token ratio)
    floor: int | None  # the group's published floor; None when none was published
    offset: int = 0  # what this round's admissions already took

    @property
    def local_term(self) -> int:
        return self.local_avail + self.evictable - self.decode_reserve - self.offset

    @property
    def remaining(self) -> int:
        """Tokens the next admission may take. The floor bounds the local term, never raises it."""
        if self.floor is None:
            return self.local_term
        return min(self.local_term, self.floor - self.offset)

    def spend(self, tokens: int) -> None:
        self.offset += tokens

    def as_fields(self) -> dict[str, int | None]:
        d = asdict(self)
        d["remaining"] = self.remaining
        return d


@dataclass(slots=True, frozen=True)
class Admit:
    tokens: int  # new tokens scheduled for this request in this round
    pages: int  # fresh pages they need


@dataclass(slots=True, frozen=True)
class Park:
    reason: str  # "below_page": the budget cannot fund one page; "step_budget": no room this step
    need: int  # tokens the request still wants prefilled
    fundable: int  # tokens the budget could fund


def plan_chunk(
    *, held: int, remaining: int, chunk_tokens: int, budget: int, page_size: int
) -> Admit | Park:
    """The chunk a request may take this round.

    ``held``: tokens it already has in the pool (its last page may have room left);
    ``remaining``: tokens it still wants prefilled; ``budget``: tokens the round can fund.
    A chunk that stops short of the end stops on a page boundary.
    """
    if remaining <= 0:
        raise ValueError(f"plan_chunk: nothing to prefill (remaining={remaining})")
    room = (-held) % page_size  # free slots in the request's partial last page
    fundable = room + max(0, budget) // page_size * page_size
    take = min(remaining, chunk_tokens, fundable)
    if take < remaining:
        take = (held + take) // page_size * page_size - held  # end the chunk on a page boundary
    if take <= 0:
        return Park("below_page", need=remaining, fundable=max(0, fundable))
    return Admit(take, fresh_pages(held, take, page_size))


def prefill_floor(decodes: int, page_size: int) -> int:
    """The least the first chunk of a step gets: as many tokens as the step decodes, in whole
    pages, one page at least. Without a floor, decodes that fill the budget hold every prompt
    back until some of them finish; with one page only, 64 decoders on 1-token pages would feed
    a 2,048-token prompt one token a step, and a burst of prompts would queue behind its own
    first half. Matching the decodes keeps a step with prefill within about twice the cost of
    the same step without it (a forward's cost grows with its tokens), whatever the load."""
    return max(page_size, decodes // page_size * page_size)


def step_room(*, step_tokens: int | None, decodes: int, planned: int, page_size: int) -> int | None:
    """Prefill tokens the step budget leaves for the next chunk (None: no step budget).

    ``decodes``: the step's decode tokens; ``planned``: prefill tokens its chunks already took;
    the first chunk of a step gets at least ``prefill_floor``."""
    if step_tokens is None:
        return None
    room = step_tokens - decodes - planned
    return max(room, prefill_floor(decodes, page_size)) if planned == 0 else room


class StepPlan(NamedTuple):
    plan: Admit | Park
    step_cut: bool  # the step budget made the chunk shorter than memory and chunk_tokens allow


def plan_in_step(
    *, held: int, remaining: int, chunk_tokens: int, room: int | None, budget: int, page_size: int
) -> StepPlan:
    """``plan_chunk`` within the step's ``room`` too. A chunk the room cannot hold (not one
    page's boundary) is ``Park("step_budget")``: it waits for the next step, not for memory."""
    plan = plan_chunk(
        held=held,
        remaining=remaining,
        chunk_tokens=chunk_tokens,
        budget=budget,
        page_size=page_size,
    )
    if room is None or isinstance(plan, Park) or plan.tokens <= room:
        return StepPlan(plan, False)
    cut = plan_chunk(
        held=held,
        remaining=remaining,
        chunk_tokens=max(0, room),
        budget=budget,
        page_size=page_size,
    )
    if isinstance(cut, Park):
        return StepPlan(Park("step_budget", need=remaining, fundable=cut.fundable), True)
    return StepPlan(cut, True)


@dataclass(slots=True)
class NewTokenRatio:
    """How much of their remaining max_tokens running decodes are expected to still use.

    Starts optimistic-but-safe, decays each decode step towards ``minimum`` (requests usually stop
    early), and jumps back up on a retraction (the estimate was too low)."""

    value: float = 0.7
    minimum: float = 0.1
    decay: float = 0.001

    def step(self) -> None:
        self.value = max(self.minimum, self.value - self.decay)

    def on_retract(self, decoded: int, remaining_max: int, retracted: int) -> tuple[float, float]:
        """Raise the ratio after a retraction; returns (old, new)."""
        old = self.value
        estimate = (decoded + 2 * retracted) / max(1, decoded + remaining_max)
        self.value = min(1.0, max(old, estimate, old + 0.1))
        return old, self.value


def decode_reserve(remaining_max: list[int], ratio: float, clip: int = 4096) -> int:
    """Tokens the running decodes are expected to need: each request's remaining max_tokens
    (clipped) times the ratio, rounded up."""
    return sum(-(-int(min(r, clip) * ratio * 1000) // 1000) for r in remaining_max)


def line_closed(
    *,
    chunk_budget: int,
    running: int,
    max_running: int,
    throttled: bool = False,
    step_budget: int | None = None,
) -> str | None:
    """Why no waiting request can be looked at this round (None: the line is open).
    ``throttled``: the relief ladder's throttle holds new admissions while anything runs (with
    nothing running there is nothing to protect, and a closed line would only idle);
    ``step_budget``: the step's room left for prefill (None: no step budget)."""
    if chunk_budget <= 0:
        return "chunk_budget"
    if step_budget is not None and step_budget <= 0:
        return "step_budget"
    if running >= running_ceiling(max_running):
        return "max_running"
    if throttled and running > 0:
        return "throttle"
    return None


def defer_reason(
    plan: Admit | Park, *, chunked: bool, inflight: int, settled: int, max_running: int
) -> str | None:
    """Why the request at the head of the line waits although it was planned (None: admit it).

    ``chunked``: its plan stops short of its prompt; ``inflight``: chunked prefills already in
    flight; ``settled``: running requests that are not mid-prefill."""
    if isinstance(plan, Park):
        return "step_budget" if plan.reason == "step_budget" else "budget"
    if chunked and inflight >= MAX_INFLIGHT_CHUNKED:
        return "inflight_chunk"
    if settled >= max_running and not chunked:
        return "max_running"  # only the in-flight chunk may use the one extra slot
    return None


def overtakes(line: Sequence[int], priority: int) -> int:
    """How many requests at the back of a waiting line (their priority values, front first) a
    new request of ``priority`` goes ahead of: those whose value is larger (the lower value
    waits less, as vLLM orders them), never one of its equals (they came first)."""
    ahead = 0
    for value in reversed(line):
        if value <= priority:
            break
        ahead += 1
    return ahead
