"""Admission, wired: the round's two phases over the pure decisions of ``admission.py``. It asks
and decides; the memory authority (``memory.Memory``) answers the numbers and does the memory
work it decides on: a waiting request's prefix claimed and loaded, its start, room made.

1. The in-flight chunked prefill (at most one) continues first. It takes what the budget funds;
   below one page the relief ladder is asked first (site ``park``: the throttle closes the line,
   the retract rung may send decoders back in line), and what it still cannot fund parks
   (law 3): zero tokens, its KV kept, retried next round.
2. Then requests in line, first come first served, each with its cached prefix locked before
   its budget is read (its own prefix is not evictable for itself). The first request that must
   wait closes the line for this round, with one ``admission.defer`` receipt saying why.

Both phases share the step budget (``step_room``): the step's decodes come off it first, and a
chunk it cuts short, or a request it holds back, says so (``step_cut``, reason
``step_budget``).

Every admission, park and unpark is a receipt carrying the budget it was decided on. Admission
runs before the step's decode slots are taken (a decoder the ladder retracts must not hold
one), so the budget counts those slots as already gone (``pending_decode``).
"""

from __future__ import annotations

import time
from collections import deque

from engine.config import SchedulerSection
from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.scheduler.admission import (
    Admit,
    Budget,
    NewTokenRatio,
    Park,
    StepPlan,
    decode_reserve,
    defer_reason,
    line_closed,
    plan_in_step,
    step_room,
)
from engine.scheduler.holdings import Prefix
from engine.scheduler.memory import Memory
from engine.scheduler.request import Request, State

Planned = list[tuple[Request, int]]  # (request, tokens scheduled for it this round)


class Admitter:
    """Plans each round's prefill chunks. It shares the scheduler's ``running`` list and
    ``waiting`` queue: it takes a request it admits off the second, and memory's ``start``
    puts it in the first."""

    def __init__(
        self,
        config: SchedulerSection,
        memory: Memory,
        receipts: Receipts,
        ratio: NewTokenRatio,
        running: list[Request],
        waiting: deque[Request],
    ) -> None:
        self.config = config
        self.memory = memory  # the numbers its budget reads (agreed across a group) and the work
        self.receipts = receipts
        self.ratio = ratio
        self.running = running
        self.waiting = waiting
        self.page_size = memory.page_size
        self.closed_for: str | None = None  # why the line is closed for good (a drain cutover)
        self.decode: list[Request] = []  # this step's decoding requests, slots not yet taken

    def close_line(self, reason: str) -> None:
        """Nothing new starts until ``open_line``: everything in line defers with ``reason``."""
        self.closed_for = reason

    def open_line(self) -> None:
        self.closed_for = None

    def admit(self, decode: list[Request]) -> Planned:
        """This round's chunks. ``decode``: this step's decoding requests, whose remaining
        tokens are reserved. The budget reads the group's floor as memory's numbers now."""
        self.decode = list(decode)
        budget = Budget(0, 0, 0, None)
        self._reread(budget)
        planned: Planned = []
        chunking = [r for r in self.running if r.prefilling]
        cap = self.continue_chunk(chunking, budget, planned)
        self.admit_waiting(len(chunking), budget, cap, planned)
        return planned

    def continue_chunk(self, chunking: list[Request], budget: Budget, planned: Planned) -> int:
        """Phase 1: the in-flight chunked requests continue, or park. Returns the chunk budget
        left for phase 2."""
        cap = self.config.chunk_tokens
        for req in chunking:
            room = self._room(planned)
            step = self._plan(req.kv_len, req.prefill_target - req.kv_len, cap, room, budget)
            plan = step.plan
            if isinstance(plan, Park) and plan.reason != "step_budget":
                want = min(plan.need, cap) if room is None else min(plan.need, cap, room)
                if self._relieve(req, want, budget):
                    room = self._room(planned)  # a retracted decoder gave its step token back
                    step = self._plan(req.kv_len, plan.need, cap, room, budget)
                    plan = step.plan
            if isinstance(plan, Park) and plan.reason == "step_budget":
                self.receipts.emit(
                    schema.ADMISSION_DEFER,
                    count=1,
                    reason=plan.reason,
                    rid=req.rid,
                    running=len(self.running),
                    step_budget=room,
                    **budget.as_fields(),
                )
                continue  # no room left in this step: not a park, memory is not short
            if isinstance(plan, Park):
                if req.state is not State.PARKED:
                    req.state = State.PARKED
                    req.parks += 1
                    self.receipts.emit(
                        schema.ADMISSION_PARK,
                        rid=req.rid,
                        reason=plan.reason,
                        need=plan.need,
                        fundable=plan.fundable,
                        page_size=self.page_size,
                        **budget.as_fields(),
                    )
                continue
            if req.state is State.PARKED:
                req.state = State.RUNNING
                self.receipts.emit(
                    schema.ADMISSION_UNPARK, rid=req.rid, tokens=plan.tokens, **budget.as_fields()
                )
            self._emit_admit(req, step, budget, room, chunked=True)
            budget.spend(plan.pages * self.page_size)  # what the pool gives: whole pages
            cap -= plan.tokens
            planned.append((req, plan.tokens))
        return cap

    def admit_waiting(self, inflight: int, budget: Budget, cap: int, planned: Planned) -> None:
        """Phase 2: requests in line, until one must wait (a defer receipt says why).
        ``inflight``: chunked prefills already in flight (phase 1's, parked ones included)."""
        reason = room = None
        while self.waiting:
            room = self._room(planned)
            if self.closed_for is not None:  # nothing new starts while a cutover drains
                reason = self.closed_for
                break
            throttled = self.memory.throttle.active(self.receipts.iter)
            reason = line_closed(
                chunk_budget=cap,
                running=len(self.running),
                max_running=self.config.max_running,
                throttled=throttled,
                step_budget=room,
            )
            if reason is not None:
                break
            req = self.waiting[0]
            prefix = self.memory.holdings.claim_prefix(req)  # locked: not evictable for itself
            budget.evictable = self.memory.evictable()
            # the decode tokens it is expected to need come out of the same budget; with nothing
            # running there is no one to protect, and an estimate must not wedge an idle engine
            reserve = 0
            if self.running or planned:
                reserve = decode_reserve(
                    [req.params.max_tokens - len(req.output_ids)], self.ratio.value
                )
            prefix = self._reach(req, prefix, budget, reserve)
            remaining = len(req.fill_ids) - prefix.length
            step = self._plan(prefix.length, remaining, cap, room, budget, reserve)
            plan = step.plan
            chunked = isinstance(plan, Admit) and plan.tokens < remaining
            reason = defer_reason(
                plan,
                chunked=chunked,
                inflight=inflight,
                settled=len(self.running) - inflight,
                max_running=self.config.max_running,
            )
            if reason is not None:
                if prefix.length:
                    self.memory.holdings.let_go(prefix)
                    budget.evictable = self.memory.evictable()
                break
            self.waiting.popleft()
            self.memory.holdings.start(req, prefix)  # its row and prefix; it joins the running
            if req.admitted_at is None:  # its first admission (a retracted one comes back)
                req.admitted_at = time.monotonic()
                req.cached_tokens = min(req.cached_len, req.prompt_len)
            self._emit_admit(req, step, budget, room, chunked=chunked)
            budget.spend(plan.pages * self.page_size + reserve)
            cap -= plan.tokens
            inflight += int(chunked)
            planned.append((req, plan.tokens))
        if reason is not None and self.waiting:
            self.receipts.emit(
                schema.ADMISSION_DEFER,
                count=len(self.waiting),
                reason=reason,
                running=len(self.running),
                step_budget=room,
                **budget.as_fields(),
            )

    def _room(self, planned: Planned) -> int | None:
        """The step budget's room for the next chunk: the decodes and the chunks planned so far
        come off it (None: no step budget)."""
        return step_room(
            step_tokens=self.config.step_tokens,
            decodes=len(self.decode),
            planned=sum(n for _, n in planned),
            page_size=self.page_size,
        )

    def _plan(
        self, held: int, need: int, cap: int, room: int | None, budget: Budget, reserve: int = 0
    ) -> StepPlan:
        """The chunk of ``need`` tokens after ``held``, within ``cap``, the step's ``room`` and
        what the budget funds beyond ``reserve``."""
        return plan_in_step(
            held=held,
            remaining=need,
            chunk_tokens=cap,
            room=room,
            budget=budget.remaining - reserve,
            page_size=self.page_size,
        )

    def _reread(self, budget: Budget) -> None:
        """The budget's memory terms, read from the pool and the step's decoders now."""
        mem = self.memory
        pending = sum(mem.fresh_slots(r, 1) for r in self.decode)
        avail = mem.available()
        if avail < pending:  # the net flushes staged frees before such an allocation fails
            avail += mem.staged()
        budget.local_avail = avail - pending
        budget.evictable = mem.evictable()
        budget.floor = mem.group.floor_now(mem.terms())  # moves with what this step freed
        rem = [r.params.max_tokens - len(r.output_ids) for r in self.decode]
        budget.decode_reserve = decode_reserve(rem, self.ratio.value)

    def _relieve(self, req: Request, want: int, budget: Budget) -> bool:
        """Before ``req`` parks: ask memory (site ``park``) for what its next chunk of ``want``
        tokens lacks. True when the budget, read again, grew."""
        if not self.memory.serves("park"):
            return False
        before = budget.remaining
        self.memory.make_room(want - max(0, before), "park", req.rid)
        self.decode = [r for r in self.decode if r.state is State.RUNNING]  # retracted: gone
        self._reread(budget)
        return budget.remaining > before

    def _reach(self, req: Request, prefix: Prefix, budget: Budget, reserve: int) -> Prefix:
        """A hit carried on below the device, as far as the round's budget funds: memory loads
        its host part, then goes on in the durable store. Loaded tokens take device memory as
        computed ones would (eviction may pay for them), so the budget reads the pool again
        after each."""
        holdings = self.memory.holdings
        if prefix.host_len:  # a hit in the host tier
            prefix = holdings.load_host(prefix, budget.remaining - reserve, req.rid)
            self._reread(budget)
        if holdings.stored and not prefix.host_len:  # and on, in the store
            prefix = holdings.load_stored(prefix, budget.remaining - reserve, req.rid)
            self._reread(budget)
        return prefix

    def _emit_admit(
        self, req: Request, step: StepPlan, budget: Budget, room: int | None, *, chunked: bool
    ) -> None:
        plan = step.plan
        assert isinstance(plan, Admit)
        self.receipts.emit(
            schema.ADMISSION_ADMIT,
            rid=req.rid,
            tokens=plan.tokens,
            pages=plan.pages,
            prefix_hit=req.cached_len,
            held=req.kv_len,
            chunked=chunked,
            retracted=req.retractions,
            decodes=len(self.decode),
            step_budget=room,
            step_cut=step.step_cut,
            **budget.as_fields(),
            **_unmatched(req),
        )


def _unmatched(req: Request) -> dict[str, str]:
    """Why the prefix cache was not read for ``req``: it scores its prompt, and the cache holds
    no logits (``admit_waiting`` matches nothing for it)."""
    return {"no_prefix": "prompt_logprobs"} if req.scores_prompt(0) else {}
