"""Speculation in the step: which decoding requests get drafts, how many the pool funds, and what
the target's rows keep of them.

A request is drafted for when its next token is the argmax of the model's own row: greedy, no
bias or penalty, no grammar, no logprobs asked, past its ``min_tokens`` (so no stop token is
banned). Its drafts are prompt lookup over its prompt and output (``engine.spec.propose``), at
most ``spec_tokens``, never past its ``max_tokens`` or the context. Drafts are funded only from
what the step leaves spare after its decodes and chunks: they never make room (no eviction, no
retraction, no allocation through the net for them); where the spare pages fund fewer drafts
than proposed, the request's drafts are cut, with a ``spec.cut`` receipt, and at zero it decodes
one token as usual. The rows keep the drafts the model agrees with (``accept_greedy``): the
output is the one decoding one token a step gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.mem.allocator import TokenAllocator
from engine.obs import schema
from engine.obs.receipts import Receipts
from engine.sched.memory import Memory
from engine.sched.request import Request
from engine.spec.propose import NgramIndex
from engine.spec.verify import accept_greedy


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
    def __init__(self, k: int, allocator: TokenAllocator, receipts: Receipts) -> None:
        self.k = k
        self.allocator = allocator
        self.receipts = receipts
        self.tally = Tally()

    @staticmethod
    def eligible(req: Request) -> bool:
        p = req.params
        return (p.greedy and not p.adjusts_logits and req.guided is None and p.logprobs is None
                and not req.banned_stops())  # fmt: skip

    def propose(self, req: Request) -> list[int]:
        """Up to ``k`` drafts after the request's text, within its max_tokens and context."""
        if req.spec is None:
            req.spec = NgramIndex(tokens=req.prompt_ids)
        # only the tokens new since the last step: fill_ids would copy the whole text each step
        req.spec.extend(req.output_ids[len(req.spec.tokens) - req.prompt_len :])
        room = min(req.params.max_tokens - len(req.output_ids),
                   req.max_context - req.prompt_len - len(req.output_ids)) - 1  # fmt: skip
        return req.spec.propose(min(self.k, room)) if room > 0 else []

    def fund(self, decode: list[Request], spare: int) -> dict[str, list[int]]:
        """Each drafted request's drafts, funded in decode order from ``spare`` slots (what the
        step's chunks leave; the decodes' own next slots are taken out here), cut where the
        spare pages run out."""
        spare -= sum(self.allocator.fresh_slots(r.kv_len, 1) for r in decode)
        out: dict[str, list[int]] = {}
        for req in decode:
            if not self.eligible(req):
                continue
            drafts = self.propose(req)
            if not drafts:
                continue
            base = self.allocator.fresh_slots(req.kv_len, 1)
            got = len(drafts)
            while got and self.allocator.fresh_slots(req.kv_len, 1 + got) - base > spare:
                got -= 1
            if got < len(drafts):
                self.receipts.emit(schema.SPEC_CUT, rid=req.rid, want=len(drafts), got=got,
                                   spare=max(spare, 0))  # fmt: skip
            if got:
                spare -= self.allocator.fresh_slots(req.kv_len, 1 + got) - base
                out[req.rid] = drafts[:got]
                self.tally.proposed += got
                req.spec_proposed += got
        return out

    def accept(self, req: Request, drafts: list[int], rows: torch.Tensor) -> list[int]:
        """The tokens the rows emit: the drafts the model agrees with, then its own."""
        emitted = accept_greedy(drafts, rows.argmax(dim=-1).tolist())
        kept = len(emitted) - 1
        self.tally.accepted += kept
        req.spec_accepted += kept
        return emitted

    def advance(
        self, req: Request, drafts: list[int], rows: torch.Tensor, memory: Memory
    ) -> list[int]:
        """Append what the rows accept (up to the token that ends the request) and give back
        the KV of the drafts not kept: the tokens appended."""
        start = req.kv_len - 1 - len(drafts)  # the position of the request's last token
        emitted = self.accept(req, drafts, rows)
        applied: list[int] = []
        for t in emitted:
            req.append_token(t)
            applied.append(t)
            if req.finish_reason is not None:
                break
        # K/V is in the pool for the last token and each kept draft that was appended
        memory.shrink(req, start + 1 + min(len(emitted) - 1, len(applied)))
        return applied
