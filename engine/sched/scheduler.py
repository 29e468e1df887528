"""The scheduler core: continuous batching with chunked prefill, usable step by step.

Each ``step()`` runs one forward: prefill work first (chunks of prompts, up to
``chunk_tokens`` new tokens), otherwise one decode token for every running request.

Admission is conservative: a request is admitted only when the pool can fund its worst case
(prompt + max_tokens) on top of what the running requests may still claim, so a decode step
can never find the pool empty.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.mem.allocator import TokenAllocator
from engine.mem.ledger import ledger_violations
from engine.mem.req_table import ReqToTokenPool
from engine.model.detok import IncrementalDetokenizer
from engine.model.tokenizer import Tokenizer
from engine.obs.receipts import Receipts
from engine.runner import BatchEntry, ModelRunner
from engine.sampling import SamplingParams, make_generator, sample
from engine.sched.request import Request, State


@dataclass(slots=True)
class StepOutput:
    rid: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: str | None


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
    ) -> None:
        self.receipts = receipts or Receipts()
        self._was_busy = False
        self.config = config
        self.runner = runner
        self.allocator = allocator
        self.req_table = req_table
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        torch.manual_seed(config.seed)

    # -- intake -------------------------------------------------------------------------------

    def add_request(
        self, prompt_ids: list[int], params: SamplingParams, rid: str | None = None
    ) -> Request:
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
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use")
        req = Request(
            rid=rid,
            prompt_ids=list(prompt_ids),
            params=params,
            detok=IncrementalDetokenizer(self.tokenizer),
            stop_ids=self.tokenizer.stop_ids,
            max_context=self.max_context,
            generator=make_generator(params.seed),
        )
        if self._pages(req.worst_case_tokens) * self.allocator.page_size > self.allocator.capacity:
            raise ValueError(
                f"prompt ({len(prompt_ids)}) + max_tokens ({params.max_tokens}) needs "
                f"{req.worst_case_tokens} KV slots; the pool has {self.allocator.capacity}"
            )
        self.requests[rid] = req
        self.waiting.append(req)
        return req

    def abort(self, rid: str) -> bool:
        req = self.requests.get(rid)
        if req is None or req.state is State.FINISHED:
            return False
        if req.state is State.WAITING:
            self.waiting.remove(req)
        req.finish_reason = "abort"
        self._finish(req)
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        self.receipts.iter += 1
        self._admit()
        prefill = [r for r in self.running if r.prefilling]
        if prefill:
            outs = self._prefill(prefill)
        elif self.running:
            outs = self._decode(list(self.running))
        else:
            outs = []
        if self.config.check_invariants:
            self.check()
        elif self._was_busy and not self.has_work():
            self.audit_idle()  # production: the ledger is checked whenever the engine goes idle
        self._was_busy = self.has_work()
        return outs

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.allocator.page_size)

    def _reserved(self) -> int:
        """Tokens (whole pages) the running requests may still claim beyond what they hold."""
        return self.allocator.page_size * sum(
            self._pages(r.worst_case_tokens) - self._pages(r.kv_len) for r in self.running
        )

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_running:
            req = self.waiting[0]
            fundable = self.allocator.available_size() - self._reserved()
            need = self._pages(req.worst_case_tokens) * self.allocator.page_size
            if need > fundable or self.req_table.available_rows() == 0:
                return  # stays first in line; retried next step as running requests finish
            self.waiting.popleft()
            req.row = self.req_table.alloc()
            req.state = State.RUNNING
            self.running.append(req)

    def _take_slots(self, req: Request, n: int) -> torch.Tensor:
        last = int(self.req_table.table[req.row, req.kv_len - 1]) if req.kv_len else None
        slots = self.allocator.alloc_extend(req.kv_len, n, last)
        if slots is None:  # admission reserved these; reaching here is a bookkeeping bug
            raise RuntimeError(
                f"KV pool could not fund {n} slots for {req.rid} "
                f"(available {self.allocator.available_size()})"
            )
        self.req_table.write(req.row, req.kv_len, slots)
        return slots

    def _prefill(self, reqs: list[Request]) -> list[StepOutput]:
        budget = self.config.chunk_tokens
        batch: list[BatchEntry] = []
        chunked: list[tuple[Request, bool]] = []
        for req in reqs:
            if budget <= 0:
                break
            n = min(req.prompt_len - req.kv_len, budget)
            budget -= n
            slots = self._take_slots(req, n)
            batch.append(
                BatchEntry(req.row, req.kv_len, req.prompt_ids[req.kv_len : req.kv_len + n], slots)
            )
            req.kv_len += n
            chunked.append((req, not req.prefilling))
        logits = self.runner.forward(batch)
        done = [i for i, (_, complete) in enumerate(chunked) if complete]
        if not done:
            return []
        return self._sample_and_advance([chunked[i][0] for i in done], logits[done])

    def _decode(self, reqs: list[Request]) -> list[StepOutput]:
        batch = []
        for req in reqs:
            slots = self._take_slots(req, 1)
            batch.append(BatchEntry(req.row, req.kv_len, [req.output_ids[-1]], slots))
            req.kv_len += 1
        return self._sample_and_advance(reqs, self.runner.forward(batch))

    def _sample_and_advance(self, reqs: list[Request], logits: torch.Tensor) -> list[StepOutput]:
        for i, req in enumerate(reqs):
            # min_tokens: the request may not stop before it has that many tokens
            if len(req.output_ids) < req.params.min_tokens and not req.params.ignore_eos:
                stop = set(req.stop_ids) | set(req.params.stop_token_ids or ())
                logits[i, sorted(stop)] = float("-inf")
        tokens = sample(logits, [r.params for r in reqs], [r.generator for r in reqs])
        outs = []
        for req, tid in zip(reqs, tokens):
            req.append_token(tid)
            finished = req.finish_reason is not None
            delta = req.take_text_delta()
            if finished:
                self._finish(req)
            outs.append(StepOutput(req.rid, [tid], delta, finished, req.finish_reason))
        return outs

    def _finish(self, req: Request) -> None:
        if req.row is not None:
            self.allocator.free(self.req_table.slots(req.row, req.kv_len))
            self.req_table.free(req.row)
            req.row = None
            req.kv_len = 0
        if req in self.running:
            self.running.remove(req)
        req.state = State.FINISHED
        self.requests.pop(req.rid, None)

    def _private_tokens(self) -> int:
        return self.allocator.page_size * sum(self._pages(r.kv_len) for r in self.running)

    def violations(self) -> list[tuple[str, dict[str, object]]]:
        """Broken memory invariants, each reported once per kind as a receipt."""
        found = ledger_violations(self.allocator, None, self._private_tokens())
        for what, numbers in found:
            self.receipts.violation(what, **numbers)
        return found

    def audit_idle(self) -> None:
        """The idle-time check: receipts only, never an exception into the serving loop."""
        try:
            self.violations()
        except Exception as e:  # a diagnostic must not raise into what it observes
            self.receipts.notice("idle_check_failed", f"idle ledger check failed: {e}")

    def check(self) -> None:
        """Check mode: the ledger balances and each structure's own check passes, else raise."""
        found = self.violations()
        if found:
            raise AssertionError(f"memory invariants violated: {found}")
