"""Speculation in the step: which decoding requests get drafts, how many the pool funds, and what
the target's rows keep of them.

Every decoding request may be drafted for (greedy or sampled, with bias, penalties, a grammar,
logprobs or ``min_tokens``), except one that samples with its own seed (its answer must not
depend on what the pool funds), unless its drafts have stopped paying (``engine.speculative.pace``: it
steps aside, ``spec.off``, and tries again later, ``spec.on``) or the batch is too wide for any
to pay (the same receipts with ``scope`` batch). Its drafts come from the proposer
(``engine.speculative.propose``), at most ``spec_tokens``, never past its ``max_tokens`` or the
context. Drafts are funded only from what the step leaves spare after its decodes and chunks:
they never make room (no eviction, no retraction, no allocation through the net for them);
where the spare pages fund fewer drafts than proposed, the request's drafts are cut, with a
``spec.cut`` receipt, and at zero it decodes one token as usual.

The rows are made what the request samples from at each position (stop tokens it may not end
on yet and its grammar's mask, walked over the drafts; then ``engine.speculative.verify``: bias and
penalties, greedy or sampled acceptance): the output is distributed as one token a step gives,
and greedy output is the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.config import SchedulerSection
from engine.guided.masks import Masks
from engine.memory.allocator import TokenAllocator
from engine.model.llama import LlamaModel
from engine.model.sampling import prompt_logprobs
from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.request.messages import SpecCounts
from engine.scheduler.holdings import Holdings
from engine.scheduler.request import Request
from engine.speculative.pace import MAX_BATCH
from engine.speculative.propose import PromptLookup, Proposer, SuffixLookup
from engine.speculative.verify import verify


@dataclass(slots=True)
class Tally:
    """Drafts proposed (funded) and accepted since the last iteration receipt."""

    proposed: int = 0
    accepted: int = 0

    def take(self) -> tuple[int, int]:
        out = (self.proposed, self.accepted)
        self.proposed = self.accepted = 0
        return out


class Speculator:
    def __init__(
        self,
        k: int,
        proposer: Proposer,
        allocator: TokenAllocator,
        receipts: Receipts,
        masks: Masks,
        rows: int | None = None,
    ) -> None:
        self.k = k
        # the most token rows a step with drafts may carry (the step budget; in fast mode the
        # packed kernel's, so a drafted position is computed as the decode step it saves; None:
        # any)
        self.rows = rows
        self.max_batch = MAX_BATCH if rows is None else min(MAX_BATCH, rows - 1)
        self.proposer = proposer
        self.allocator = allocator
        self.receipts = receipts
        self.masks = masks
        self.tally = Tally()
        self.aside = False  # the batch is too wide for drafts
        self.batch = 0  # decoding requests in this step: what a drafted position costs
        # since boot (/metrics): verifications, drafts verified, drafts kept at each position
        self.verified = self.verified_tokens = 0
        self.kept_at = [0] * k

    def drafting(self, decode: Sequence[Request]) -> bool:
        """Whether a batch of ``decode`` requests drafts at all (receipted when it changes)."""
        aside = len(decode) > self.max_batch
        if aside != self.aside:
            self.aside = aside
            kind = schema.SPEC_OFF if aside else schema.SPEC_ON
            self.receipts.emit(kind, scope="batch", decoding=len(decode), max_batch=self.max_batch)
        return not aside

    def eligible(self, req: Request) -> bool:
        """Whether the request is drafted for this step: not while it steps aside, and never
        when it samples with a seed of its own (its draws would then depend on the drafts the
        pool funds, and a seed promises the same answer under any load)."""
        pace = req.pace
        if pace.off_for >= 0 and req.params.seed is not None and req.params.temperature > 0:
            pace.stop()
            self.receipts.emit(schema.SPEC_OFF, scope="request", rid=req.rid, reason="seed")
        if not pace.off_for:
            return True
        if pace.waited():
            self.receipts.emit(schema.SPEC_ON, scope="request", rid=req.rid)
        return False

    def propose(self, req: Request) -> list[int]:
        """Up to ``k`` drafts after the request's text, within its max_tokens and context."""
        room = (
            min(
                req.params.max_tokens - len(req.output_ids),
                req.max_context - req.prompt_len - len(req.output_ids),
            )
            - 1
        )
        return self.proposer.propose(req, min(req.pace.drafts(self.k), room)) if room > 0 else []

    def fund(
        self, decode: list[Request], spare: int, chunks: Sequence[tuple[Request, int]] = ()
    ) -> dict[str, list[int]]:
        """Each drafted request's drafts, funded in decode order from ``spare`` slots (what the
        step's ``chunks`` leave; the decodes' own next slots are taken out here), cut where the
        spare pages run out or the step's rows (the decodes', the chunks', the drafts') reach
        ``rows``."""
        self.batch = len(decode)
        if not self.drafting(decode):
            return {}
        spare -= sum(self.allocator.fresh_slots(r.kv_len, 1) for r in decode)
        room = (self.rows or 1 << 30) - len(decode) - sum(n for _, n in chunks)  # for drafts
        out: dict[str, list[int]] = {}
        for req in decode:
            if not self.eligible(req) or not (drafts := self.propose(req)):
                continue
            got, slots = self._funded(req, min(len(drafts), max(room, 0)), spare)
            if got < len(drafts):
                by_rows = {"rows": max(room, 0)} if self.rows else {}
                self.receipts.emit(
                    schema.SPEC_CUT,
                    rid=req.rid,
                    want=len(drafts),
                    got=got,
                    spare=max(spare, 0),
                    **by_rows,
                )
            if got:
                spare, room = spare - slots, room - got
                out[req.rid] = drafts[:got]
                self.tally.proposed += got
                req.spec_proposed += got
        return out

    def _funded(self, req: Request, got: int, spare: int) -> tuple[int, int]:
        """How many of ``got`` drafts the spare slots fund after the request's next slot, and
        the fresh slots they take."""
        base = self.allocator.fresh_slots(req.kv_len, 1)
        while got and (slots := self.allocator.fresh_slots(req.kv_len, 1 + got) - base) > spare:
            got -= 1
        return (got, slots) if got else (0, 0)

    def accept(
        self, req: Request, drafts: list[int], rows: torch.Tensor
    ) -> tuple[list[int], torch.Tensor]:
        """The tokens the rows emit (the drafts kept, then one of the model's) and the rows as
        the request samples from them (masked and adjusted: its logprobs are read there)."""
        # a view of the forward's (inference, maybe column-major) logits: the grammar's masks
        # are written in place, into rows laid out as xgrammar reads them
        rows = rows.clone(memory_format=torch.contiguous_format)
        for i in range(len(drafts) + 1):
            if banned := req.banned_stops(ahead=i):
                rows[i, banned] = float("-inf")
        if req.guided is not None:  # drafts past the first the grammar refuses are not checked
            drafts = drafts[: self.masks.draft_rows(req.guided, drafts, rows)]
            rows = rows[: len(drafts) + 1]
        p = req.params
        return verify(drafts, rows, p, req.generator, req.output_ids, req.prompt_ids)

    def advance(
        self, req: Request, drafts: list[int], rows: torch.Tensor, holdings: Holdings
    ) -> tuple[list[int], bool]:
        """Append what the rows accept (up to the token that ends the request) and give back
        the KV of the drafts not kept: the tokens appended, and whether the grammar refused
        one (a mask not applied: the request ends as the one-token step ends it)."""
        start = req.kv_len - 1 - len(drafts)  # the position of the request's last token
        emitted, adjusted = self.accept(req, drafts, rows)
        applied: list[int] = []
        refused = False
        for j, t in enumerate(emitted):
            if req.guided is not None and not req.guided.accept(t):
                refused = True
                break
            if (k := req.params.logprobs) is not None:
                req.logprobs.append(prompt_logprobs(adjusted[j][None], [t], k)[0])
            req.append_token(t)
            applied.append(t)
            if req.finish_reason is not None:
                break
        kept = min(len(emitted) - 1, len(applied))  # drafts appended
        # K/V is in the pool for the last token and each kept draft
        holdings.shrink(req, start + 1 + kept)
        self._count(req, len(drafts), kept)
        return applied, refused

    def _count(self, req: Request, proposed: int, kept: int) -> None:
        self.verified += 1
        self.verified_tokens += proposed
        for i in range(kept):
            self.kept_at[i] += 1
        self.tally.accepted += kept
        req.spec_accepted += kept
        if req.finish_reason is None and req.pace.verified(proposed, kept, self.batch):
            self.receipts.emit(
                schema.SPEC_OFF,
                scope="request",
                rid=req.rid,
                rate=round(req.pace.rate, 3),
                steps=req.pace.off_for,
            )

    def finished(self, req: Request) -> None:
        self.proposer.finished(req)

    def counts(self) -> SpecCounts:
        return SpecCounts(
            self.verified, self.verified_tokens, sum(self.kept_at), tuple(self.kept_at)
        )

    def iteration_fields(self) -> dict[str, int]:
        """The iteration receipt's: drafts funded and kept since the last one (when not both
        0), and the tokens the suffix proposer holds of recent outputs."""
        out: dict[str, int] = {}
        if (t := self.tally.take()) != (0, 0):
            out["spec_proposed"], out["spec_accepted"] = t
        if isinstance(self.proposer, SuffixLookup):
            out["spec_recent_tokens"] = self.proposer.recent.tokens
        return out


def speculator(
    sc: SchedulerSection,
    allocator: TokenAllocator,
    receipts: Receipts,
    masks: Masks,
    model: LlamaModel | None = None,
) -> Speculator | None:
    """The step's speculator as ``sc.speculative`` asks (None: off). A step with drafts carries
    at most ``step_tokens`` rows (the step budget bounds the forward, drafts included) and, in
    fast mode, at most the rows the packed kernel takes (the quant plan's ``small_rows``): it
    computes each row as it computes one, where a wider product would round differently and
    cost more (BENCHMARKS.md: int8's kernel at 5 rows costs what it does at 8)."""
    if sc.speculative == "off":
        return None
    proposer = SuffixLookup() if sc.speculative == "suffix" else PromptLookup()
    quant = model.quant if model is not None else None
    caps = [sc.step_tokens or 0, quant.small_rows if quant is not None else 0]
    rows = min((c for c in caps if c > 0), default=None)
    return Speculator(sc.spec_tokens, proposer, allocator, receipts, masks, rows)
