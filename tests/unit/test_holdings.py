"""What a request holds of the pool, taken and given back through the memory authority alone:
a claimed prefix is locked until it is let go or released; a started request holds its row
and its prefix's slots; a release gives everything back (the ledger balances at every point);
the frees made inside ``Memory.frees_together`` are staged and applied once, at its end."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from engine.memory.allocator import TokenAllocator
from engine.memory.radix import RadixCache
from engine.memory.req_table import ReqToTokenPool
from engine.model.sampling import SamplingParams
from engine.observability.receipts import Receipts
from engine.scheduler.admission import NewTokenRatio
from engine.scheduler.group import GroupView
from engine.scheduler.ledger import ledger_violations
from engine.scheduler.memory import Memory
from engine.scheduler.request import Request, State
from tests.unit.test_detok_and_request import make_tokenizer

TOK = make_tokenizer()
PAGE = 4
SHARED = list(range(10, 22))  # 12 tokens: three whole pages


def memory(capacity: int = 64) -> Memory:
    allocator = TokenAllocator(capacity, page_size=PAGE)
    cache = RadixCache(allocator)
    lines: tuple[list[Request], deque[Request]] = ([], deque())
    table = ReqToTokenPool(4, 128)
    return Memory(
        allocator, table, cache, GroupView(), Receipts(), lines, NewTokenRatio(), ladder=False
    )


def cached(mem: Memory, tokens: list[int]) -> None:
    """``tokens`` computed once and handed to the prefix cache."""
    mem.cache.insert(tokens, mem.allocator.alloc(len(tokens)))


def request(rid: str, prompt: list[int], **params) -> Request:
    return Request.create(rid, prompt, SamplingParams(max_tokens=4, **params), TOK, 128)


def balanced(mem: Memory) -> bool:
    return ledger_violations(mem.allocator, mem.cache, mem.holdings.private_tokens()) == []


def test_a_claimed_prefix_is_locked_until_it_is_let_go():
    mem = memory()
    cached(mem, SHARED)
    prefix = mem.holdings.claim_prefix(request("a", SHARED + [5, 6, 7]))
    assert prefix.length == len(SHARED) and prefix.host_len == 0
    assert mem.evictable() == 0  # its own prefix is not evictable for its budget
    mem.holdings.let_go(prefix)
    assert mem.evictable() == len(SHARED) and mem.cache.protected_size() == 0


def test_a_request_scoring_its_prompt_claims_nothing():
    mem = memory()
    cached(mem, SHARED)
    prefix = mem.holdings.claim_prefix(request("a", SHARED + [5], prompt_logprobs=1))
    assert prefix.length == 0 and prefix.tokens == []
    assert mem.evictable() == len(SHARED)


@pytest.mark.parametrize("grown", [3, 4, 9])  # a partial page, a whole one, past one
def test_a_started_request_holds_its_row_and_prefix_and_its_release_gives_all_back(grown):
    mem = memory()
    cached(mem, SHARED)
    req = request("a", SHARED + [5, 6, 7, 8, 9, 1, 2, 3, 4])
    rows = mem.req_table.available_rows()
    prefix = mem.holdings.claim_prefix(req)
    mem.holdings.start(req, prefix)
    assert req.state is State.RUNNING and mem.running == [req]
    assert (req.cached_len, req.kv_len, req.prefill_target) == (12, 12, len(req.fill_ids))
    assert torch.equal(mem.req_table.slots(req.row, 12), prefix.match.slots)
    first = mem.alloc(req, grown, "extend")  # its own tokens, through the net, in its row
    req.kv_len += grown
    assert torch.equal(mem.req_table.slots(req.row, req.kv_len)[12:], first)
    assert mem.holdings.private_of(req) == -(-req.kv_len // PAGE) * PAGE - 12 and balanced(mem)
    mem.holdings.release(req)
    assert mem.running == [] and req.row is None and mem.req_table.available_rows() == rows
    assert mem.cache.protected_size() == 0 and balanced(mem)
    whole = (12 + grown) // PAGE * PAGE  # its computed whole pages stay cached for reuse
    assert mem.cache.total_size() == whole
    assert mem.available() == mem.capacity - whole


def test_frees_inside_frees_together_are_staged_and_applied_once_at_its_end():
    mem = memory()
    req = request("a", [5, 6, 7, 8, 9])
    mem.holdings.start(req, mem.holdings.claim_prefix(req))
    mem.alloc(req, 5, "extend")
    req.kv_len = 5
    before = mem.available()
    with mem.frees_together():
        with mem.frees_together():  # an inner one joins the group already open
            mem.holdings.release(req)  # the partial last page is freed: staged
        assert mem.staged() == PAGE and mem.available() == before  # not available yet
        assert balanced(mem)
    assert mem.staged() == 0 and mem.available() == before + PAGE
    assert not mem.allocator.group_open and balanced(mem)
