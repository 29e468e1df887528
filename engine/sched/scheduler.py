"""The scheduler core: continuous batching with chunked prefill, usable step by step.

One ``step()`` is one forward over a flat batch: a decode token for every decoding request,
plus prefill chunks admitted within this round's budget. The order inside a step is fixed:

1. read the group's published floor (once, before any branch);
2. fund the decodes: evict, else retract victims (requeued, never lost);
3. admit: the in-flight chunked request first (it may park), then waiting requests;
4. forward, sample, and apply the results inside a free group (frees are batched).

Every decision writes a receipt with its inputs. Memory is taken only through ``_alloc``,
the allocation-site net: flush staged frees, evict, one relief, one retry, then the error.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.mem.allocator import TokenAllocator
from engine.mem.ledger import ledger_violations
from engine.mem.radix import RadixCache
from engine.mem.req_table import ReqToTokenPool
from engine.model.detok import IncrementalDetokenizer
from engine.model.tokenizer import Tokenizer
from engine.obs import schema
from engine.obs.receipts import Receipts
from engine.obs.tracing import RequestTraces, split_trace
from engine.runner import BatchEntry, ModelRunner
from engine.sampling import SamplingParams, make_generator, sample
from engine.sched.admission import (
    MAX_INFLIGHT_CHUNKED,
    Admit,
    Budget,
    NewTokenRatio,
    Park,
    decode_reserve,
    plan_chunk,
    running_ceiling,
)
from engine.sched.group import GroupView
from engine.sched.relief import ReliefRegistry
from engine.sched.request import Request, State


class KVPoolExhausted(RuntimeError):
    """An allocation failed after the whole net (flush, evict, relief, retry)."""


@dataclass(slots=True)
class StepOutput:
    rid: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: str | None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    parks: int = 0  # set on the final output: times the request parked
    retractions: int = 0  # ... and was retracted


def victim_order(reqs: list[Request]) -> list[Request]:
    """Retraction order: fewest generated tokens first, ties by the longest prompt."""
    return sorted(reqs, key=lambda r: (len(r.output_ids), -r.prompt_len))


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        allocator: TokenAllocator,
        req_table: ReqToTokenPool,
        tokenizer: Tokenizer,
        max_context: int,
        receipts: Receipts | None = None,
        cache: RadixCache | None = None,
        group: GroupView | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.allocator = allocator
        self.req_table = req_table
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.receipts = receipts or Receipts()
        self.cache = cache or RadixCache(
            allocator, disabled=not config.prefix_cache, receipts=self.receipts
        )
        self.group = group or GroupView()
        self.relief = ReliefRegistry(self.receipts)
        self.ratio = NewTokenRatio()
        self.page_size = allocator.page_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self._was_busy = False
        self.traces: RequestTraces | None = None  # set by RequestTraces.attach when tracing is on
        torch.manual_seed(config.seed)

    # -- intake -------------------------------------------------------------------------------

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        rid: str | None = None,
        trace_id: str | None = None,
    ) -> Request:
        """``trace_id``: a W3C traceparent (its spans go under that span; receipts carry its
        trace id) or a bare trace id."""
        params.validate()
        if not prompt_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        bad = [t for t in prompt_ids if not 0 <= t < self.runner.model.cfg.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary")
        if len(prompt_ids) >= self.max_context:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; the context limit is {self.max_context}"
            )
        rid = rid or f"r-{next(self._ids)}"
        if not self._fits_pool(len(prompt_ids) + 1):  # a decision: it could never run here
            cap = self.allocator.capacity
            self.receipts.emit(
                schema.REQUEST_REJECT, rid=rid, reason="exceeds_pool",
                need=len(prompt_ids) + 1, capacity=cap,
            )  # fmt: skip
            raise ValueError(f"prompt has {len(prompt_ids)} tokens; the KV pool holds {cap}")
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use")
        trace_id, trace_parent = split_trace(trace_id)
        req = Request(
            rid=rid,
            prompt_ids=list(prompt_ids),
            params=params,
            detok=IncrementalDetokenizer(self.tokenizer),
            stop_ids=self.tokenizer.stop_ids,
            max_context=self.max_context,
            generator=make_generator(params.seed),
            trace_id=trace_id,
            trace_parent=trace_parent,
        )
        self.requests[rid] = req
        self.waiting.append(req)
        if self.traces is not None:
            self.traces.open(req)
        self.receipts.emit(
            schema.REQUEST_RECEIVED,
            rid=rid,
            prompt_tokens=req.prompt_len,
            max_new_tokens=params.max_tokens,
            trace_id=trace_id,
        )
        return req

    def abort(self, rid: str, reason: str = "abort") -> StepOutput | None:
        """End a request that has not finished: its final output, or None when there is no
        such request. An abort that leaves the engine idle runs the idle ledger check."""
        req = self.requests.get(rid)
        if req is None or req.state is State.FINISHED:
            return None
        if req.state is State.WAITING:
            self.waiting.remove(req)
        out = self._end(req, abort_reason=reason)
        if not self.has_work():
            self.audit_idle()
        return out

    def drop_for_test(self, rid: str) -> None:
        """Test-only: lose a request without an ending receipt (the fault the auditor's
        no_request_lost window must catch). Its memory is handed back so the ledger balances."""
        req = self.requests.pop(rid)
        if req in self.waiting:
            self.waiting.remove(req)
        self._release(req)
        req.state = State.FINISHED

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        self.receipts.iter += 1
        floor = self.group.published_floor()  # read once, before any branch
        if floor is not None:
            self.receipts.emit(schema.GROUP_FLOOR, floor=floor, local=self._local_avail())
        outs: list[StepOutput] = []
        decode = self._fund_decode(outs)
        batch: list[BatchEntry] = []
        for req in decode:
            slots = self._alloc(req, 1, "decode")
            batch.append(BatchEntry(req.row, req.kv_len, [req.output_ids[-1]], slots))
            req.kv_len += 1
        chunks = self._admit(floor, decode)
        need = self.page_size * sum(self.allocator.pages_needed(r.kv_len, n) for r, n in chunks)
        if need > self.allocator.available_size():  # admission counted evictable tokens: pay them
            self.cache.evict(need - self.allocator.available_size(), reason="admission")
        for req, n in chunks:
            slots = self._alloc(req, n, "extend")
            batch.append(
                BatchEntry(req.row, req.kv_len, req.fill_ids[req.kv_len : req.kv_len + n], slots)
            )
            req.kv_len += n
        if batch:
            logits = self.runner.forward(batch)
            rows = list(range(len(decode)))
            samplers = list(decode)
            for i, (req, _) in enumerate(chunks):
                if not req.prefilling:  # this chunk completed its prefill: sample its next token
                    rows.append(len(decode) + i)
                    samplers.append(req)
            if samplers:
                outs += self._sample_and_advance(samplers, logits[rows])
            if decode:
                self.ratio.step()
        if self.traces is not None:
            self.traces.step_done(chunks)
        interval = self.config.iteration_receipt_interval
        if interval and self.receipts.iter % interval == 0:
            self._iteration_receipt()
        if self.config.check_invariants:
            self.check()
        elif self._was_busy and not self.has_work():
            self.audit_idle()  # production: the ledger is checked whenever the engine goes idle
        self._was_busy = self.has_work()
        return outs

    # -- decode memory and retraction ---------------------------------------------------------

    def _fund_decode(self, outs: list[StepOutput]) -> list[Request]:
        """The decoding requests whose next slot is funded; retracts victims until they are."""
        alloc = self.allocator
        while True:
            decode = [r for r in self.running if r.state is State.RUNNING and not r.prefilling]
            need = self.page_size * sum(alloc.pages_needed(r.kv_len, 1) for r in decode)
            if need <= alloc.available_size() + alloc.staged_size():  # staged: the net flushes
                return decode
            if self.cache.evictable_size() > 0:
                self.cache.evict(need - alloc.available_size(), reason="decode")
                continue
            if len(self.running) > 1:
                self._retract(self._pick_victims(need), need)
                continue
            req = self.running[0]
            if not self._fits_pool(req.kv_len + 1):
                # alone, and its next token does not fit the whole pool: it never can
                outs.append(
                    self._end(
                        req,
                        abort_reason="exceeds_pool",
                        need=req.kv_len + 1,
                        capacity=alloc.capacity,
                    )
                )
                continue
            return decode  # the pool is held elsewhere: the allocation-site net takes over

    def _pick_victims(self, need: int) -> list[Request]:
        """Victims in retraction order until what they free covers the shortfall (always at
        least one, never the last running request)."""
        victims: list[Request] = []
        freed = self.allocator.available_size() + self.cache.evictable_size()
        for req in victim_order(self.running)[: len(self.running) - 1]:
            victims.append(req)
            freed += self._pages(req.kv_len) * self.page_size
            if freed >= need + self.page_size * len(victims):
                break
        return victims

    def _retract(self, victims: list[Request], need: int) -> None:
        """The one actuator that takes running requests back to the front of the line."""
        candidates = [[r.rid, len(r.output_ids), r.prompt_len] for r in victim_order(self.running)]
        available, evictable = self.allocator.available_size(), self.cache.evictable_size()
        decoded = sum(len(r.output_ids) for r in self.running)
        remaining = sum(r.params.max_tokens - len(r.output_ids) for r in self.running)
        freed = 0
        for req in victims:
            freed += self._private_of(req) + req.cached_len
            self._release(req)
            req.retractions += 1
            req.state = State.WAITING
        old, new = self.ratio.on_retract(decoded, remaining, len(victims))
        self.receipts.emit(
            schema.RETRACT,
            rids=[r.rid for r in victims],
            tokens_freed=freed,
            ratio_old=round(old, 4),
            ratio_new=round(new, 4),
            need=need,
            available=available,
            evictable=evictable,
            candidates=candidates,  # [rid, generated, prompt_tokens] in retraction order
            running_after=len(self.running),
        )
        for req in reversed(victims):  # the first victim ends up first in line
            self.waiting.appendleft(req)
        for req in victims:
            self.receipts.emit(schema.REQUEUE, rid=req.rid, generated=len(req.output_ids))

    # -- admission ----------------------------------------------------------------------------

    def _admit(self, floor: int | None, decode: list[Request]) -> list[tuple[Request, int]]:
        """``decode``: this step's decoding requests, whose remaining tokens are reserved."""
        rem = [r.params.max_tokens - len(r.output_ids) for r in decode]
        budget = Budget(
            local_avail=self.allocator.available_size(),
            evictable=self.cache.evictable_size(),
            decode_reserve=decode_reserve(rem, self.ratio.value),
            floor=floor,
        )
        cap = self.config.chunk_tokens
        planned: list[tuple[Request, int]] = []
        # 1. the in-flight chunked request (at most one) continues first; it may park
        chunking = [r for r in self.running if r.prefilling]
        for req in chunking:
            plan = plan_chunk(
                held=req.kv_len,
                remaining=req.prefill_target - req.kv_len,
                chunk_tokens=cap,
                budget=budget.remaining,
                page_size=self.page_size,
            )
            if isinstance(plan, Park):
                if req.state is not State.PARKED:
                    req.state = State.PARKED
                    req.parks += 1
                    self.receipts.emit(
                        schema.ADMISSION_PARK, rid=req.rid, reason=plan.reason, need=plan.need,
                        fundable=plan.fundable, page_size=self.page_size, **budget.as_fields(),
                    )  # fmt: skip
                continue
            if req.state is State.PARKED:
                req.state = State.RUNNING
                self.receipts.emit(
                    schema.ADMISSION_UNPARK, rid=req.rid, tokens=plan.tokens, **budget.as_fields()
                )
            self._emit_admit(req, plan, budget, chunked=True)
            budget.spend(plan.tokens)
            cap -= plan.tokens
            planned.append((req, plan.tokens))
        # 2. requests in line, first come first served
        inflight = len(chunking)
        reason = None
        while self.waiting:
            if cap <= 0:
                reason = "chunk_budget"
                break
            if len(self.running) >= running_ceiling(self.config.max_running):
                reason = "max_running"
                break
            req = self.waiting[0]
            fill = req.fill_ids
            match = self.cache.match_prefix(fill[: len(fill) - 1])  # leave one token to compute
            if match.length:  # lock first: its own prefix is not evictable for its budget
                self.cache.inc_lock_ref(match.node)
            budget.evictable = self.cache.evictable_size()
            remaining = len(fill) - match.length
            # the decode tokens it is expected to need come out of the same budget; with nothing
            # running there is no one to protect, and an estimate must not wedge an idle engine
            reserve = 0
            if self.running or planned:
                reserve = decode_reserve(
                    [req.params.max_tokens - len(req.output_ids)], self.ratio.value
                )
            plan = plan_chunk(
                held=match.length, remaining=remaining, chunk_tokens=cap,
                budget=budget.remaining - reserve, page_size=self.page_size,
            )  # fmt: skip
            chunked = isinstance(plan, Admit) and plan.tokens < remaining
            settled = len(self.running) - inflight
            if isinstance(plan, Park):
                reason = "budget"
            elif chunked and inflight >= MAX_INFLIGHT_CHUNKED:
                reason = "inflight_chunk"
            elif settled >= self.config.max_running and not chunked:
                reason = "max_running"  # only the in-flight chunk may use the one extra slot
            if reason is not None:
                if match.length:
                    self.cache.dec_lock_ref(match.node)
                    budget.evictable = self.cache.evictable_size()
                break
            self.waiting.popleft()
            self._start(req, match.node, match.slots)
            self._emit_admit(req, plan, budget, chunked=chunked)
            budget.spend(plan.tokens + reserve)
            cap -= plan.tokens
            inflight += int(chunked)
            planned.append((req, plan.tokens))
        if reason is not None and self.waiting:
            self.receipts.emit(
                schema.ADMISSION_DEFER, count=len(self.waiting), reason=reason,
                running=len(self.running), **budget.as_fields(),
            )  # fmt: skip
        return planned

    def _start(self, req: Request, node: object, prefix: torch.Tensor) -> None:
        """Give a request its row and its cached prefix (which the caller has locked)."""
        req.row = self.req_table.alloc()
        n = int(prefix.numel())
        if n:  # the caller locked `node` already
            self.req_table.write(req.row, 0, prefix)
            req.prefix_node = node
        req.cached_len = req.kv_len = n
        req.prefill_target = len(req.fill_ids)
        if req.admitted_at is None:
            req.admitted_at = time.monotonic()
            req.cached_tokens = min(n, req.prompt_len)
        req.state = State.RUNNING
        self.running.append(req)

    def _emit_admit(self, req: Request, plan: Admit, budget: Budget, *, chunked: bool) -> None:
        self.receipts.emit(
            schema.ADMISSION_ADMIT, rid=req.rid, tokens=plan.tokens, pages=plan.pages,
            prefix_hit=req.cached_len, held=req.kv_len, chunked=chunked,
            retracted=req.retractions, **budget.as_fields(),
        )  # fmt: skip

    # -- the allocation-site net --------------------------------------------------------------

    def _alloc(self, req: Request, n: int, site: str) -> torch.Tensor:
        # the last slot matters only when the last page has room (never with page_size 1)
        partial = req.kv_len % self.page_size
        last = int(self.req_table.table[req.row, req.kv_len - 1]) if partial else None

        def call() -> torch.Tensor | None:
            return self.allocator.alloc_extend(req.kv_len, n, last)

        slots = call()
        if slots is None:
            need = self.allocator.pages_needed(req.kv_len, n) * self.page_size
            slots = self._net(call, need, site, req.rid)
        self.req_table.write(req.row, req.kv_len, slots)
        return slots

    def _net(self, call, need: int, site: str, rid: str) -> torch.Tensor:
        """Flush staged frees, evict, one relief, one retry of the same call, then raise."""
        r, alloc = self.receipts, self.allocator
        staged = alloc.staged_size()
        if staged:
            freed = alloc.flush_free_group()
            r.emit(schema.ALLOC_FLUSH, need=need, staged=staged, freed=freed, site=site, rid=rid)
        short = need - alloc.available_size()
        evicted = relieved = 0
        if short > 0:
            evicted = self.cache.evict(short, reason="alloc_net")
            short = need - alloc.available_size()
            if short > 0:
                relieved = self.relief.relieve(short)
            r.emit(
                schema.ALLOC_RELIEF,
                need=need,
                freed=evicted + relieved,
                evicted=evicted,
                relieved=relieved,
                site=site,
                rid=rid,
            )
        slots = call()  # the retry is the same call as the first attempt
        r.emit(schema.ALLOC_RETRY, need=need, ok=slots is not None, site=site, rid=rid)
        if slots is None:
            numbers = dict(
                need=need, available=alloc.available_size(), staged=alloc.staged_size(),
                evictable=self.cache.evictable_size(), capacity=alloc.capacity,
            )  # fmt: skip
            r.emit(schema.ALLOC_OOM, site=site, rid=rid, **numbers)
            raise KVPoolExhausted(
                f"KV pool cannot fund {need} tokens for {rid} at {site}: "
                + ", ".join(f"{k} {v}" for k, v in numbers.items())
            )
        return slots

    # -- results and endings ------------------------------------------------------------------

    def _sample_and_advance(self, reqs: list[Request], logits: torch.Tensor) -> list[StepOutput]:
        for i, req in enumerate(reqs):
            # min_tokens: the request may not stop before it has that many tokens
            if len(req.output_ids) < req.params.min_tokens and not req.params.ignore_eos:
                stop = set(req.stop_ids) | set(req.params.stop_token_ids or ())
                logits[i, sorted(stop)] = float("-inf")
        tokens = sample(logits, [r.params for r in reqs], [r.generator for r in reqs])
        outs = []
        opened = not self.allocator.group_open
        if opened:
            self.allocator.free_group_begin()  # the step's frees are applied together
        try:
            for req, tid in zip(reqs, tokens):
                req.append_token(tid)
                if req.finish_reason is not None:
                    outs.append(self._end(req, tokens=[tid]))
                else:
                    outs.append(
                        StepOutput(
                            req.rid, [tid], req.take_text_delta(), False, None, req.cached_tokens
                        )
                    )
        finally:
            if opened:
                self.allocator.free_group_end()
        return outs

    def _release(self, req: Request) -> None:
        """Hand a request's KV back: computed pages into the prefix cache (for reuse), the
        partial last page to the allocator, the prefix lock released, the row freed."""
        if req.row is not None:
            slots = self.req_table.slots(req.row, req.kv_len)
            self.cache.insert(req.fill_ids[: req.kv_len], slots)
            aligned = req.kv_len - req.kv_len % self.page_size
            if aligned < req.kv_len:
                self.allocator.free(slots[aligned:])
            if req.prefix_node is not None:
                self.cache.dec_lock_ref(req.prefix_node)
            self.req_table.free(req.row)
        if req in self.running:
            self.running.remove(req)
        req.row, req.prefix_node = None, None
        req.kv_len = req.cached_len = req.prefill_target = 0

    def _end(
        self,
        req: Request,
        tokens: list[int] | None = None,
        abort_reason: str | None = None,
        **numbers: int,
    ) -> StepOutput:
        """End a request (finish, or abort with ``abort_reason`` and the ``numbers`` behind it)."""
        if abort_reason is not None:
            req.finish_reason = "abort"
        self._release(req)
        req.state = State.FINISHED
        self.requests.pop(req.rid, None)
        now = time.monotonic()
        timing = {
            "queue_s": round((req.admitted_at or now) - req.arrival, 6),
            "ttft_s": None
            if req.first_token_time is None
            else round(req.first_token_time - req.arrival, 6),
            "e2e_s": round(now - req.arrival, 6),
        }
        common = dict(
            rid=req.rid, tokens=len(req.output_ids), prompt_tokens=req.prompt_len,
            cached=req.cached_tokens, parks=req.parks, retractions=req.retractions,
            trace_id=req.trace_id, **timing,
        )  # fmt: skip
        if abort_reason is None:
            self.receipts.emit(schema.REQUEST_FINISH, reason=req.finish_reason, **common)
        else:
            self.receipts.emit(schema.REQUEST_ABORT, reason=abort_reason, **common, **numbers)
        return StepOutput(
            req.rid, tokens or [], req.take_text_delta(), True, req.finish_reason,
            req.cached_tokens, req.parks, req.retractions,
        )  # fmt: skip

    # -- accounting ---------------------------------------------------------------------------

    def _fits_pool(self, tokens: int) -> bool:
        """Whether ``tokens`` fit the whole pool at all (whole pages)."""
        return self._pages(tokens) * self.page_size <= self.allocator.capacity

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def _private_of(self, req: Request) -> int:
        return (
            self._pages(req.kv_len) * self.page_size - req.cached_len if req.row is not None else 0
        )

    def _private_tokens(self) -> int:
        return sum(self._private_of(r) for r in self.running)

    def _local_avail(self) -> int:
        return self.allocator.available_size() + self.cache.evictable_size()

    def _iteration_receipt(self) -> None:
        cap = self.allocator.capacity
        self.receipts.emit(
            schema.ITERATION,
            running=sum(1 for r in self.running if r.state is State.RUNNING),
            waiting=len(self.waiting),
            parked=sum(1 for r in self.running if r.state is State.PARKED),
            token_usage=round(1 - self.allocator.available_size() / cap, 4),
            avail=self.allocator.available_size(),
            evictable=self.cache.evictable_size(),
            staged=self.allocator.staged_size(),
            cached=self.cache.total_size(),
            ratio=round(self.ratio.value, 4),
        )

    def violations(self) -> list[tuple[str, dict[str, object]]]:
        """Broken invariants, each reported once per kind as a receipt."""
        found = ledger_violations(self.allocator, self.cache, self._private_tokens())
        found += self._state_violations()
        for what, numbers in found:
            self.receipts.violation(what, **numbers)
        return found

    def _state_violations(self) -> list[tuple[str, dict[str, object]]]:
        out: list[tuple[str, dict[str, object]]] = []
        waiting = {r.rid for r in self.waiting}
        running = {r.rid for r in self.running}
        if (
            len(waiting) != len(self.waiting)
            or len(running) != len(self.running)
            or waiting & running
        ):
            out.append(
                (
                    "request_states",
                    {
                        "waiting": len(self.waiting),
                        "running": len(self.running),
                        "both": sorted(waiting & running),
                    },
                )
            )
        if waiting | running != set(self.requests):
            lost = sorted(set(self.requests) - waiting - running)
            extra = sorted((waiting | running) - set(self.requests))
            out.append(("request_lost", {"lost": lost, "untracked": extra}))
        for r in self.waiting:
            if r.state is not State.WAITING or r.row is not None:
                out.append(("waiting_state", {"rid": r.rid, "state": r.state.value}))
        for r in self.running:
            if r.state not in (State.RUNNING, State.PARKED) or r.row is None:
                out.append(("running_state", {"rid": r.rid, "state": r.state.value}))
        if len(self.running) > running_ceiling(self.config.max_running):
            out.append(
                (
                    "running_ceiling",
                    {"running": len(self.running), "max_running": self.config.max_running},
                )
            )
        return out

    def audit_idle(self) -> None:
        """The idle-time check: receipts only, never an exception into the serving loop."""
        try:
            self.violations()
        except Exception as e:  # a diagnostic must not raise into what it observes
            self.receipts.notice("idle_check_failed", f"idle ledger check failed: {e}")

    def check(self) -> None:
        """Check mode: the ledger balances, the structures' own checks pass, every request is
        in exactly one state; else raise."""
        found = self.violations()
        if found:
            raise AssertionError(f"invariants violated: {found}")
