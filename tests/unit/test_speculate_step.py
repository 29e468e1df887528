"""The step's side of speculation on one request, with rows made to order: what it appends when
the request ends inside its accepted drafts (nothing after the ending token), and how much K/V
it keeps (the last token and the kept drafts it appended; the rest goes back)."""

from __future__ import annotations

import torch

from engine.guided.masks import Masks
from engine.memory.allocator import TokenAllocator
from engine.observability.receipts import Receipts
from engine.scheduler.speculate import Speculator
from engine.speculative.propose import PromptLookup
from tests.unit.test_detok_and_request import make_request, make_tokenizer, tid

TOK = make_tokenizer()


def speculator() -> Speculator:
    allocator, masks = TokenAllocator(64), Masks(TOK.vocab_size)
    return Speculator(4, PromptLookup(), allocator, Receipts(capture=True), masks)


class Shrinks:
    """The holdings' ``shrink`` as the step calls it: the position kept, recorded."""

    def __init__(self) -> None:
        self.kept: list[int] = []

    def shrink(self, req, keep: int) -> None:
        self.kept.append(keep)
        req.kv_len = keep


def rows_agreeing_with(tokens: list[int]) -> torch.Tensor:
    rows = torch.zeros(len(tokens), TOK.vocab_size)
    rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return rows


def drafted(drafts: list[int], **params):
    req = make_request(TOK, max_tokens=20, temperature=0, **params)
    req.append_token(tid(TOK, "h"))  # one token out: its K/V is written with the drafts
    req.kv_len = req.prompt_len + 1 + len(drafts)  # the entry wrote last + drafts
    return req


def test_an_ending_inside_the_kept_drafts_appends_nothing_after_it():
    a, b, end, c = tid(TOK, "a"), tid(TOK, "b"), tid(TOK, "<|im_end|>"), tid(TOK, "c")
    req = drafted([a, end, b])
    spec, memory = speculator(), Shrinks()
    got, _ = spec.advance(req, [a, end, b], rows_agreeing_with([a, end, b, c]), memory)
    assert got == [a, end] and req.finish_reason == "stop"
    assert req.output_ids[-2:] == [a, end] and req.kv_len == len(req.fill_ids)
    assert memory.kept == [req.prompt_len + 1 + 2]  # the last token, a and the ending token


def test_a_rejected_draft_and_what_follows_it_go_back():
    a, b, c, d = (tid(TOK, x) for x in "abcd")
    req = drafted([a, b, c])
    spec, memory = speculator(), Shrinks()
    got, _ = spec.advance(req, [a, b, c], rows_agreeing_with([a, d, c, c]), memory)
    assert got == [a, d] and req.finish_reason is None  # b refused: the model's d instead
    assert memory.kept == [req.prompt_len + 1 + 1]  # the last token and a; d has none yet
    assert (req.spec_accepted, spec.tally.accepted) == (1, 1)
