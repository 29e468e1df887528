"""The scheduler core: continuous batching with chunked prefill, usable step by step. It owns
intake, the ordered step, decode funding and endings; it holds no memory of its own: every
slot it takes, frees or stages is the memory authority's work (``memory.py``), asked for.

One ``step()`` is one forward over a flat batch: a decode token for every decoding request,
plus prefill chunks admitted within this round's budget. The order inside a step is fixed:

1. read the group's published floor (once, before any branch);
2. fund the decodes: memory makes room (its ladder; eviction, else retraction, as its floor);
3. admit: the in-flight chunked request first (before it parks memory is asked at ``park``,
   and may retract decoders: no slot of the step is taken yet), then waiting requests, all
   within what the step budget leaves after the decodes (``step_tokens``);
4. take the step's slots, forward, sample, and apply the results inside one group of frees
   (``Memory.frees_together``).

With ``overlap_schedule`` steps 1 to 3 and the slots of the next step are planned on a worker
thread while this step's forward runs (``overlap.py``), and the next step launches that plan.

Every decision writes a receipt with its inputs. The decisions themselves are pure functions
elsewhere (``admission.py``, ``victims.py``); admission's two phases are wired in
``admitter.py``; memory (the numbers, making room, the allocation-site net, the free group,
retraction, and in ``holdings.py`` what each request holds: its prefix, its start, its
release) is ``memory.py``'s; the invariant checks live in ``checks.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from typing import NoReturn

import torch

from engine.config import EngineConfig
from engine.guided.compiler import Grammars
from engine.guided.masks import Fill, Masks
from engine.memory.allocator import TokenAllocator
from engine.memory.radix import RadixCache
from engine.memory.req_table import ReqToTokenPool
from engine.model.runner import BatchEntry, ModelRunner
from engine.model.sampling import SamplingParams, rows_of, sample_for, token_logprobs
from engine.model.tokenizer import Tokenizer
from engine.observability import computed, schema
from engine.observability.receipts import Receipts
from engine.request.messages import AbortRequest, AddRequest, PoolSnapshot, StepOutput
from engine.request.prompt import check_param_ids, check_prompt
from engine.scheduler import checks
from engine.scheduler.admission import NewTokenRatio, overtakes
from engine.scheduler.admitter import Admitter, Planned
from engine.scheduler.group import GroupView
from engine.scheduler.iteration import IterationLog, snapshot_of
from engine.scheduler.memory import Memory
from engine.scheduler.overlap import LIVE, Flight
from engine.scheduler.request import Request, State
from engine.scheduler.speculate import speculator
from engine.scheduler.traces import RequestTraces


class Plan:
    """A step's batch in order (the decodes', then the chunks') with what its results need,
    read when it is planned (each request's ``kv_len`` then counts this batch's positions):
    the requests sampled (every undrafted decode, every chunk that completes its prefill) and
    their entries, and the entries whose every position's logits are wanted (drafted decodes,
    chunks scoring their prompt; None: none)."""

    __slots__ = ("batch", "chunks", "decode", "drafts", "every", "reqs", "rows", "samplers")

    def __init__(
        self,
        batch: list[BatchEntry],
        decode: list[Request],
        chunks: Planned,
        drafts: dict[str, list[int]],
    ) -> None:
        self.batch, self.decode, self.chunks, self.drafts = batch, decode, chunks, drafts
        self.reqs = [*decode, *(r for r, _ in chunks)]
        drafted = [r.rid in drafts for r in decode]
        self.rows = [i for i, d in enumerate(drafted) if not d]
        self.rows += [len(decode) + i for i, (r, _) in enumerate(chunks) if not r.prefilling]
        self.samplers = [self.reqs[i] for i in self.rows]
        every = drafted + [r.scores_prompt(r.kv_len - n) for r, n in chunks]
        self.every = every if any(every) else None


class Scheduler:
    """Built whole: the memory authority and admission are made here from the parts given
    (``cache`` with its host tier, if any, attached; ``group``: this rank's view of its group;
    ``traces``: the request spans when tracing is on)."""

    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        allocator: TokenAllocator,
        req_table: ReqToTokenPool,
        cache: RadixCache,
        tokenizer: Tokenizer,
        max_context: int,
        receipts: Receipts,
        group: GroupView,
        traces: RequestTraces | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.allocator = allocator  # read (the snapshot, the checks); memory's to change
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.receipts = receipts
        self.cache = cache  # read too (the snapshot, the checks, the store at a stop)
        self.group = group
        self.traces = traces
        self.ratio = NewTokenRatio()
        self.page_size = allocator.page_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.memory = Memory(
            allocator,
            req_table,
            cache,
            group,
            receipts,
            (self.running, self.waiting),
            self.ratio,
            config.memory.relief_ladder,
            config.memory.relief_throttle_iterations,
            settle=self._settle,
        )
        self.admitter = Admitter(
            config.scheduler, self.memory, receipts, self.ratio, self.running, self.waiting
        )
        self._ids = itertools.count()
        self._was_busy = False
        self.iterations = IterationLog(self)
        self.generated = 0  # tokens sampled since boot: progress the iteration receipt counts
        vocab = runner.model.cfg.vocab_size
        self.grammars = Grammars.of(tokenizer, vocab, receipts, config.scheduler)
        self.masks = Masks(vocab)
        self.spec = speculator(config.scheduler, allocator, receipts, self.masks, runner.model)
        torch.manual_seed(config.scheduler.seed)
        # overlap: the forward in flight, and the step planned beside it (launched next)
        self.flight = Flight(runner.device) if config.scheduler.overlap_schedule else None
        self._planned: Plan | None = None

    # -- intake -------------------------------------------------------------------------------

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        rid: str | None = None,
        trace_id: str | None = None,
        promise: bool = False,
        arrived: float | None = None,
        api: str | None = None,
    ) -> Request:
        """``trace_id``: a W3C traceparent (its spans go under that span; receipts carry its
        trace id) or a bare trace id. ``promise``: the request is refused unless its prompt and
        ``max_tokens`` fit the pool as it is now, and then it is never ended for the pool's
        size (a pool cutover keeps the promise or is refused). ``arrived``: the wall time the
        frontend took it in, when that was before now: its latencies count from then."""
        params.validate()
        vocab = self.runner.model.cfg.vocab_size
        check_prompt(prompt_ids, vocab_size=vocab, max_context=self.max_context)
        check_param_ids(params.stop_token_ids, params.logit_bias, vocab_size=vocab)
        rid = rid or f"r-{next(self._ids)}"
        # a guide that does not compile is refused before the request is anything here
        guided = self.grammars.guided(params.guide) if params.guide else None
        need = len(prompt_ids) + (params.max_tokens if promise else 1)
        if not self.memory.fits(need):  # a decision: it could never run (to its end) here
            self._refuse(rid, len(prompt_ids), need, promise)
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use")
        req = Request.create(rid, prompt_ids, params, self.tokenizer, self.max_context, trace_id)
        req.promised = need if promise else None
        req.guided = guided
        if arrived is not None:  # queued before we saw it (a busy or stalled loop): counted
            req.arrival -= max(0.0, time.time() - arrived)
        self.group.record(
            AddRequest(
                rid=rid, prompt_ids=list(prompt_ids), params=params, trace=trace_id, promise=promise
            )
        )
        self.requests[rid] = req
        overtook = 0  # the line is first come, first served; by priority under that policy
        if self.config.scheduler.scheduling_policy == "priority":
            overtook = overtakes([r.params.priority for r in self.waiting], params.priority)
        self.waiting.insert(len(self.waiting) - overtook, req)
        if self.traces is not None:
            self.traces.open(req)
        extra: dict[str, object] = {"promised": need} if promise else {}
        if self.config.scheduler.scheduling_policy == "priority":
            extra |= {"priority": params.priority, "overtook": overtook}
        if arrived is not None:
            extra["arrived"] = round(arrived, 6)
        if api is not None:
            extra["api"] = api
        self.receipts.emit(
            schema.REQUEST_RECEIVED,
            rid=rid,
            prompt_tokens=req.prompt_len,
            max_new_tokens=params.max_tokens,
            trace_id=req.trace_id,
            **extra,
        )
        return req

    def _refuse(self, rid: str, prompt: int, need: int, promise: bool) -> NoReturn:
        """Refuse a request the pool can never hold (to its end, when promised), with a
        receipt and the numbers."""
        cap = self.memory.capacity
        self.receipts.emit(
            schema.REQUEST_REJECT, rid=rid, reason="exceeds_pool", need=need, capacity=cap
        )
        if not promise or not self.memory.fits(prompt + 1):
            raise ValueError(f"prompt has {prompt} tokens; the KV pool holds {cap}")
        raise ValueError(
            f"max_tokens {need - prompt} + prompt {prompt} tokens exceed the KV pool of {cap} "
            f"tokens: this request could never run to its end here; ask for at most "
            f"{cap - prompt}"
        )

    def abort(self, rid: str, reason: str = "abort") -> StepOutput | None:
        """End a request that has not finished: its final output, or None when there is no
        such request. An abort that leaves the engine idle runs the idle ledger check."""
        req = self.requests.get(rid)
        if req is None or req.state is State.FINISHED:
            return None
        if req.state is State.WAITING:
            self.waiting.remove(req)
        self.group.record(AbortRequest(rid=rid, reason=reason))
        out = self._end(req, reason)
        if not self.has_work():
            checks.audit_idle(self)
        return out

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        """One iteration, in the module docstring's order; returns what it produced. With
        ``overlap_schedule`` the next step is planned while this one's forward runs
        (``engine/scheduler/overlap.py``)."""
        self.receipts.next_iteration()
        if self.flight is not None:
            return self._step_overlapped(self.flight)
        outs: list[StepOutput] = []
        plan = self._plan(outs)
        if plan.batch:
            fill = self.masks.begin([r.guided for r in plan.samplers])
            outs += self._apply(plan, self.runner.forward(plan.batch, every=plan.every), fill)
        self._after_step(plan.chunks)
        return outs

    def _plan(self, outs: list[StepOutput], ahead: bool = False) -> Plan:
        """A step's decisions and slots (steps 1 to 3 and the slots of 4). ``ahead``: planned
        while the step before it runs, whose sampled tokens its decodes take at launch."""
        self.group.sync()  # rank 0 of a group hands the others what arrived
        self.group.publish(self.memory.local(), self.receipts)  # once, before any branch
        decode = self._fund_decode(outs, ahead)
        chunks = self.admitter.admit(decode)  # before any slot is taken: it may retract
        decode = [r for r in decode if r.state is State.RUNNING]  # what a retraction left
        need = sum(self.memory.fresh_slots(r, n) for r, n in chunks)
        # drafts from what the decodes and chunks leave (agreed numbers: every rank drafts alike)
        spare = self.memory.available() - need
        drafts = self.spec.fund(decode, spare, chunks) if self.spec and decode else {}
        batch = self._decode_entries(decode, drafts, ahead)
        if need > self.memory.available():  # admission counted evictable tokens: pay them
            self.memory.make_room(need - self.memory.available(), "admission")
        batch += [self._entry(r, r.fill_ids[r.kv_len : r.kv_len + n], "extend") for r, n in chunks]
        if batch and self.group.world > 1:  # before the forward: the ranks run the same batch
            self._agree(decode, chunks, drafts)
        plan = Plan(batch, decode, chunks, drafts)
        if ahead:
            for req, entry in zip(plan.reqs, batch):
                req.ahead = len(entry.token_ids)
        return plan

    def _step_overlapped(self, flight: Flight) -> list[StepOutput]:
        """Launch the step planned during the last one (or plan it now), plan the next while
        its forward runs, then apply its results."""
        outs: list[StepOutput] = []
        plan, self._planned = self._planned, None
        if plan is not None:
            plan = self._launchable(plan, flight)
        if plan is None or not plan.batch:  # nothing planned ahead: the first step after idle
            plan = self._plan(outs)
        if not plan.batch:
            self._after_step(plan.chunks)
            return outs
        fill = self.masks.begin([r.guided for r in plan.samplers])
        beside: list[StepOutput] = []  # what the plan ends (a request beyond the whole pool)
        planning = flight.beside(plan.reqs, lambda: self._plan(beside, ahead=True))
        try:
            logits = self.runner.forward(plan.batch, every=plan.every)
        except BaseException:
            flight.land()
            planning.exception()  # the plan done with (its slots are the pool's) first
            raise
        flight.land()
        self._planned = planning.result()
        flight.tally(ahead=1)
        outs += beside
        outs += self._apply(plan, logits, fill, flight.current())
        self._after_step(plan.chunks)
        return outs

    def _launchable(self, plan: Plan, flight: Flight) -> Plan:
        """``plan`` as it can run now: the entries of requests that ended or went back in line
        since it was planned dropped (their planned slots went back as they did), each decode
        given the token the step before it sampled."""
        n = len(plan.decode)
        batch, decode, chunks = [], [], []
        for i, (r, e) in enumerate(zip(plan.reqs, plan.batch)):
            if r.state not in LIVE or r.ahead != len(e.token_ids):
                continue
            r.ahead = 0
            batch.append(e)
            if i < n:
                e.token_ids = [r.output_ids[-1]]
                decode.append(r)
            else:
                chunks.append(plan.chunks[i - n])
        flight.tally(dropped=len(plan.batch) - len(batch))
        return Plan(batch, decode, chunks, plan.drafts)

    def unplan(self) -> None:
        """Give back what the step planned ahead holds (a cutover changes the pool under it)."""
        plan, self._planned = self._planned, None
        if plan is None:
            return
        with self.memory.frees_together():
            for req in plan.reqs:
                self.memory.holdings.unplan(req)

    def _settle(self) -> None:
        """Before relief lets go of KV running requests hold: the forward in flight has run."""
        if self.flight is not None:
            self.flight.settle()

    def _decode_entries(
        self, decode: list[Request], drafts: dict[str, list[int]], ahead: bool = False
    ) -> list[BatchEntry]:
        """The decodes' batch entries, in order: the undrafted ones' slots taken at once
        (``Memory.alloc_decode``), a drafted one's through the net with its drafts. ``ahead``:
        their tokens are sampled by the forward in flight (put in at launch; -1 until then)."""
        plain = [r for r in decode if not drafts.get(r.rid)]
        taken = dict(zip((r.rid for r in plain), self.memory.alloc_decode(plain, "decode")))
        batch = []
        for r in decode:
            slots = taken.get(r.rid)
            if slots is None:
                batch.append(self._entry(r, [r.output_ids[-1], *drafts[r.rid]], "decode"))
                continue
            batch.append(self._placed(r, [-1 if ahead else r.output_ids[-1]], slots))
        return batch

    def _entry(self, req: Request, tokens: list[int], site: str) -> BatchEntry:
        """The batch entry of ``tokens`` for ``req``, its slots taken through the net."""
        return self._placed(req, tokens, self.memory.alloc(req, len(tokens), site))

    @staticmethod
    def _placed(req: Request, tokens: list[int], slots: torch.Tensor) -> BatchEntry:
        """The batch entry of ``tokens`` at ``slots`` (taken and written into ``req``'s row),
        ``req`` then holding them."""
        entry = BatchEntry(req.row, req.kv_len, tokens, slots)
        req.kv_len += len(tokens)
        return entry

    def _apply(
        self, plan: Plan, logits: torch.Tensor, fill: Fill | None, live: list[bool] | None = None
    ) -> list[StepOutput]:
        """A forward's results: sample for every undrafted decode and every chunk that
        completed its prefill; keep what the rows accept of each drafted decode's drafts.
        ``live``: per entry, whether its request's result still applies (overlap: relief sent
        some back in line while the next step was planned); None: all."""
        batch, decode, chunks, drafts = plan.batch, plan.decode, plan.chunks, plan.drafts
        live = live or [True] * len(batch)
        samplers, rows = plan.samplers, plan.rows
        if not all(live):  # the dropped rows' masks are not wanted: filled again for the others
            kept = [i for i, row in enumerate(rows) if live[row]]
            samplers, rows = [samplers[i] for i in kept], [rows[i] for i in kept]
            if fill is not None:
                fill.future.result()
                fill = self.masks.begin([r.guided for r in samplers])
        spans: list[tuple[Request, torch.Tensor]] = []
        if (every := plan.every) is not None:
            ends = list(
                itertools.accumulate(len(e.token_ids) if w else 1 for e, w in zip(batch, every))
            )
            at = len(decode)
            for j, (req, n) in enumerate(chunks):
                if every[at + j] and live[at + j]:  # from where its chunk began
                    req.score_prompt(
                        batch[at + j].prefix_len, logits[ends[at + j] - n : ends[at + j]]
                    )
            spans = [
                (r, logits[ends[i] - len(batch[i].token_ids) : ends[i]])
                for i, r in enumerate(decode)
                if r.rid in drafts and live[i]
            ]
            rows = [ends[r] - 1 for r in rows]
        # the sampler adjusts its rows in place: a drafted decode's rows (``spans``) are others
        outs = self._sample_and_advance(samplers, rows_of(logits, rows), fill) if samplers else []
        if spans:
            outs += self._advance_drafted(spans, drafts)
        if decode:
            self.ratio.step()
        return outs

    def _agree(self, decode: list[Request], chunks: Planned, drafts: dict[str, list]) -> None:
        """The batch's digest (drafts counted), written every iteration, compared every K."""
        entries = [(r.rid, 1 + len(drafts.get(r.rid, ()))) for r in decode]
        entries += [(r.rid, n) for r, n in chunks]
        digest = computed.batch_digest(entries)
        self.iterations.write(digest)
        self.group.agree(self.receipts.iter, digest)

    def _after_step(self, chunks: Planned) -> None:
        if self.traces is not None:
            self.traces.step_done(chunks)
        if self.iterations.due():
            self.iterations.write()
        if self.config.scheduler.check_invariants:
            checks.check(self)
        elif self._was_busy and not self.has_work():
            checks.audit_idle(self)  # production: the ledger is checked whenever it goes idle
        self._was_busy = self.has_work()
        if not self._was_busy:  # what was planned ahead ended with its requests
            self._planned = None

    # -- decode memory and retraction ---------------------------------------------------------

    def _fund_decode(self, outs: list[StepOutput], ahead: bool = False) -> list[Request]:
        """The decoding requests whose next slot is funded; memory makes room until they are
        (its ladder, then eviction or retraction as its floor). ``ahead``: planned beside the
        forward before it, so a request the token that forward samples must end is left out."""
        memory = self.memory  # agreed numbers: every rank retracts the same victims
        while True:
            decode = [
                r
                for r in self.running
                if r.state is State.RUNNING and not r.prefilling and not (ahead and r.last_ahead())
            ]
            need = sum(memory.fresh_slots(r, 1) for r in decode)
            if need <= memory.available() + memory.staged():  # staged: the net flushes them
                return decode
            if memory.make_room(need - memory.available(), "decode").progress:
                continue
            req = self.running[0]
            if not memory.fits(req.kv_len + 1):
                self._settle()  # it ends: the forward in flight has read its KV first
                # alone, and its next token does not fit the whole pool: it never can
                need = req.kv_len + 1
                outs.append(self._end(req, "exceeds_pool", need=need, capacity=memory.capacity))
                continue
            return decode  # the pool is held elsewhere: the allocation-site net takes over

    # -- results and endings ------------------------------------------------------------------

    def _sample_and_advance(
        self, reqs: list[Request], logits: torch.Tensor, fill: Fill | None = None
    ) -> list[StepOutput]:
        tokens = self._sample(reqs, logits, fill)
        self.generated += len(tokens)
        outs = []
        with self.memory.frees_together():
            for req, tid in zip(reqs, tokens):
                if req.guided is not None and not req.guided.accept(tid):  # a mask not applied
                    outs.append(self._end(req, "grammar", tokens=[]))
                    continue
                req.append_token(tid)
                done = req.finish_reason is not None
                outs.append(self._end(req, tokens=[tid]) if done else req.output([tid]))
        return outs

    @torch.inference_mode()  # the stops' and masks' writes go to the forward's own logits
    def _sample(self, reqs: list[Request], logits: torch.Tensor, fill: Fill | None) -> list[int]:
        """Each request's token from its row (``logits``, in ``reqs``' order), its stops banned
        and its grammar's mask applied first; the log-probabilities of those who asked."""
        for i, req in enumerate(reqs):
            if banned := req.banned_stops():
                logits[i, banned] = float("-inf")
        if fill is not None:  # the grammars' masks, before any penalty or bias reads the row
            self.masks.apply(fill, logits)
        tokens = sample_for(logits, reqs)
        for i, (req, tid) in enumerate(zip(reqs, tokens)):  # only for those who asked
            if req.params.logprobs is not None:
                row, p = logits[i], req.params
                req.logprobs.append(token_logprobs(row, tid, p, req.output_ids, req.prompt_ids))
        return tokens

    def _advance_drafted(
        self, spans: list[tuple[Request, torch.Tensor]], drafts: dict[str, list[int]]
    ) -> list[StepOutput]:
        """Each drafted request takes what its rows accept; its rejected drafts' KV goes back."""
        assert self.spec is not None
        outs, holdings = [], self.memory.holdings
        with self.memory.frees_together():
            for req, rows in spans:
                tokens, refused = self.spec.advance(req, drafts[req.rid], rows, holdings)
                self.generated += len(tokens)
                if refused or req.finish_reason is not None:  # refused: a mask not applied
                    outs.append(self._end(req, "grammar" if refused else None, tokens=tokens))
                else:
                    outs.append(req.output(tokens))
        return outs

    def _end(
        self,
        req: Request,
        abort_reason: str | None = None,
        tokens: list[int] | None = None,
        **numbers: int,
    ) -> StepOutput:
        """End a request (finish, or abort with ``abort_reason`` and the ``numbers`` behind it)."""
        if abort_reason is not None:
            req.finish_reason, req.abort_reason = "abort", abort_reason
            if req.promised is not None:
                numbers["promised"] = req.promised
        self.memory.holdings.release(req)
        if self.spec is not None:
            self.spec.finished(req)
        req.state = State.FINISHED
        self.requests.pop(req.rid, None)
        timing = req.timing(time.monotonic())
        common = dict(
            rid=req.rid,
            tokens=len(req.output_ids),
            prompt_tokens=req.prompt_len,
            cached=req.cached_tokens,
            parks=req.parks,
            retractions=req.retractions,
            trace_id=req.trace_id,
            output_hash=req.output_hash(),
            **timing,
        )
        if req.guided is not None:
            common["constrained"] = req.guided.guide.kind
        if req.spec_proposed:
            common |= {"spec_proposed": req.spec_proposed, "spec_accepted": req.spec_accepted}
        if abort_reason is None:
            self.receipts.emit(schema.REQUEST_FINISH, reason=req.finish_reason, **common)
        else:
            self.receipts.emit(schema.REQUEST_ABORT, reason=abort_reason, **common, **numbers)
        return dataclasses.replace(req.output(tokens or []), timing=timing)

    # -- accounting ---------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """The state after a step: the ``iteration`` receipt, /metrics and /health read it."""
        return snapshot_of(self)

    # -- invariants (checks.py) -----------------------------------------------------------------

    def check(self) -> None:
        """Raise when an invariant is broken (check mode runs this after every step)."""
        checks.check(self)
