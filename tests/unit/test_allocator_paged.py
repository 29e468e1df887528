"""TokenAllocator with pages: whole-page allocation, request extends that fill their partial
last page first, free validation, staged free groups, and the staged-frees field failure
(an eviction inside an open free group that frees tokens alloc cannot use until a flush)."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.memory.allocator import TokenAllocator
from engine.memory.radix import RadixCache
from engine.observability import schema
from engine.observability.receipts import Receipts

PAGE_SIZES = [1, 4, 16]


def t(xs: list[int]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def sizes(a: TokenAllocator) -> tuple[int, int, int]:
    return a.available_size(), a.staged_size(), a.used_size()


def assert_whole_pages(a: TokenAllocator, slots: list[int]) -> None:
    """``slots`` are whole pages: runs of ``page_size`` consecutive slots, each run starting on
    a page boundary, none on the padding page nor outside the pool."""
    ps = a.page_size
    assert len(slots) % ps == 0
    for i in range(0, len(slots), ps):
        page = slots[i : i + ps]
        assert page[0] % ps == 0, f"page run {page} does not start on a page boundary"
        assert page == list(range(page[0], page[0] + ps)), f"{page} is not consecutive"
        assert ps <= page[0] < a.pool_slots, f"{page} lies on the padding page or outside"


def assert_request_layout(ps: int, slots: list[int]) -> None:
    """A request's tokens [k*ps, (k+1)*ps) sit in one page, in order: token i at offset i % ps
    of the page holding its whole page-aligned block."""
    for i, s in enumerate(slots):
        block_first = slots[i - i % ps]
        assert s // ps == block_first // ps, f"token {i} (slot {s}) left its block's page"
        assert s % ps == i % ps, f"token {i} sits at offset {s % ps} of its page"


# -- construction -----------------------------------------------------------------------------


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_capacity_is_whole_pages_plus_a_padding_page(ps):
    a = TokenAllocator(5 * ps + ps - 1, page_size=ps)  # a ragged tail is dropped
    assert a.num_pages == 5 and a.capacity == 5 * ps
    assert a.pool_slots == 6 * ps
    assert sizes(a) == (5 * ps, 0, 0)
    a.check()


def test_bad_construction_is_refused():
    with pytest.raises(ValueError, match="page_size must be >= 1, got 0"):
        TokenAllocator(8, page_size=0)
    with pytest.raises(ValueError, match="capacity 3 is less than one page of 4 tokens"):
        TokenAllocator(3, page_size=4)


# -- alloc ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ps", [4, 16])
@pytest.mark.parametrize("k", [1, -1, 3])
def test_alloc_of_a_partial_page_is_a_value_error_naming_the_page_size(ps, k):
    a = TokenAllocator(4 * ps, page_size=ps)
    with pytest.raises(ValueError, match=f"alloc\\({ps + k}\\).*page_size {ps}"):
        a.alloc(ps + k)
    assert sizes(a) == (4 * ps, 0, 0)
    a.check()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_returns_whole_pages_of_consecutive_slots(ps):
    a = TokenAllocator(6 * ps, page_size=ps)
    got = [a.alloc(n * ps).tolist() for n in (1, 3, 2)]
    for g in got:
        assert_whole_pages(a, g)
    every = [s for g in got for s in g]
    assert sorted(every) == list(range(ps, 7 * ps))  # all of the pool but the padding page
    assert sizes(a) == (0, 0, 6 * ps)
    a.check()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_is_never_partial(ps):
    a = TokenAllocator(5 * ps, page_size=ps)
    held = a.alloc(3 * ps)
    assert a.alloc(3 * ps) is None  # 2 pages left: nothing is taken
    assert sizes(a) == (2 * ps, 0, 3 * ps)
    a.check()
    rest = a.alloc(2 * ps)
    assert rest is not None and rest.numel() == 2 * ps
    assert set(rest.tolist()).isdisjoint(held.tolist())
    assert a.alloc(ps) is None
    assert a.alloc(0).numel() == 0  # zero pages always succeed
    a.check()


# -- pages_needed / alloc_extend (one token and more) ----------------------------------------


@pytest.mark.parametrize(
    ("held", "extend", "pages"),
    [
        (0, 0, 0),
        (0, 1, 1),
        (0, 4, 1),
        (0, 5, 2),
        (3, 1, 0),  # fits the last free slot of the partial page
        (3, 2, 1),
        (4, 0, 0),
        (4, 1, 1),  # last page full
        (5, 3, 0),
        (5, 4, 1),
        (5, 7, 1),
        (5, 8, 2),
        (6, 10, 2),
    ],
)
def test_pages_needed_table_page_size_4(held, extend, pages):
    assert TokenAllocator(16, page_size=4).pages_needed(held, extend) == pages


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_pages_needed_is_pages_after_minus_pages_before(ps):
    a = TokenAllocator(ps, page_size=ps)
    for held in range(3 * ps + 2):
        for extend in range(3 * ps + 2):
            want = -(-(held + extend) // ps) - -(-held // ps)
            assert a.pages_needed(held, extend) == want, (held, extend)


@pytest.mark.parametrize("ps", [4, 16])
def test_alloc_extend_fills_the_partial_last_page_then_fresh_pages(ps):
    a = TokenAllocator(8 * ps, page_size=ps)
    first = a.alloc_extend(0, ps + 1, None).tolist()  # a page and one token
    assert len(first) == ps + 1
    assert_whole_pages(a, first[:ps])
    assert first[ps] % ps == 0  # the new page starts at its first slot
    avail = a.available_size()
    # two more tokens fit the partial page: no page is taken, slots follow last_slot
    more = a.alloc_extend(ps + 1, 2, first[-1]).tolist()
    assert more == [first[-1] + 1, first[-1] + 2]
    assert a.available_size() == avail
    # the rest of that page, then one fresh page exactly
    room = ps - 3
    tail = a.alloc_extend(ps + 3, room + ps, more[-1]).tolist()
    assert tail[:room] == list(range(more[-1] + 1, more[-1] + 1 + room))
    assert_whole_pages(a, tail[room:])
    assert a.available_size() == avail - ps
    assert_request_layout(ps, first + more + tail)
    a.check()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_interleaved_requests_keep_their_blocks_in_their_own_pages(ps):
    """Three requests extending and decoding in turn: each request's page-aligned blocks stay
    in one page, in order, and no page is shared between requests."""
    rng = torch.Generator().manual_seed(ps)
    a = TokenAllocator(60 * (2 * ps + 2) + 3 * ps, page_size=ps)  # never runs short
    reqs: list[list[int]] = [[], [], []]
    for _ in range(60):
        r = int(torch.randint(3, (1,), generator=rng))
        slots = reqs[r]
        last = slots[-1] if slots else None
        if slots and bool(torch.rand(1, generator=rng) < 0.5):
            got = a.alloc_extend(len(slots), 1, last)
        else:
            extend = int(torch.randint(0, 2 * ps + 2, (1,), generator=rng))
            got = a.alloc_extend(len(slots), extend, last)
        assert got is not None
        slots.extend(got.tolist())
    for slots in reqs:
        assert_request_layout(ps, slots)
    pages = [{s // ps for s in slots} for slots in reqs]
    assert pages[0].isdisjoint(pages[1]) and pages[0].isdisjoint(pages[2])
    assert pages[1].isdisjoint(pages[2])
    assert a.used_size() == sum(len(p) for p in pages) * ps
    a.check()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_one_more_token_takes_a_page_only_when_the_last_page_is_full(ps):
    a = TokenAllocator(4 * ps, page_size=ps)
    slots: list[int] = []
    for held in range(3 * ps):
        before = a.available_size()
        got = a.alloc_extend(held, 1, slots[-1] if slots else None)
        assert got is not None and got.numel() == 1
        slots.append(int(got))
        took = before - a.available_size()
        assert took == (ps if held % ps == 0 else 0), f"held {held}: took {took} tokens"
    assert_request_layout(ps, slots)
    a.check()


@pytest.mark.parametrize("ps", [4, 16])
def test_a_partial_page_without_its_last_slot_is_a_value_error(ps):
    a = TokenAllocator(4 * ps, page_size=ps)
    a.alloc_extend(0, 1, None)
    before = sizes(a)
    with pytest.raises(ValueError, match="partial last page needs its last slot"):
        a.alloc_extend(1, 3, None)
    with pytest.raises(ValueError, match="partial last page needs its last slot"):
        a.alloc_extend(ps + 1, 1, None)
    assert sizes(a) == before
    # a page-aligned request needs no last slot
    assert a.alloc_extend(ps, 2, None).numel() == 2
    a.check()


def test_alloc_extend_negative_counts_are_value_errors():
    a = TokenAllocator(16, page_size=4)
    with pytest.raises(ValueError, match="held 0 and extend -1"):
        a.alloc_extend(0, -1, None)
    with pytest.raises(ValueError, match="held -4 and extend 1"):
        a.alloc_extend(-4, 1, None)
    assert sizes(a) == (16, 0, 0)


@pytest.mark.parametrize("ps", [4, 16])
def test_alloc_extend_short_of_pages_takes_nothing_not_even_the_partial_page(ps):
    a = TokenAllocator(3 * ps, page_size=ps)
    req = a.alloc_extend(0, 1, None).tolist()  # 1 page, 1 token held
    other = a.alloc(ps)  # 1 page left
    assert a.available_size() == ps
    # (ps - 1) fit the partial page, then 2 fresh pages are needed; only 1 is there
    assert a.alloc_extend(1, (ps - 1) + ps + 1, req[-1]) is None
    assert sizes(a) == (ps, 0, 2 * ps)
    # an extend that fits the partial page alone works even when the pool is empty
    assert a.alloc(ps) is not None and a.available_size() == 0
    fit = a.alloc_extend(1, ps - 1, req[-1])
    assert fit.tolist() == list(range(req[-1] + 1, req[-1] + ps))
    assert a.alloc_extend(ps, 1, fit.tolist()[-1]) is None  # page full, pool empty
    assert other is not None
    a.check()


# -- free validation --------------------------------------------------------------------------


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_free_frees_whole_pages_for_reuse(ps):
    a = TokenAllocator(4 * ps, page_size=ps)
    req = a.alloc_extend(0, ps + 1, None)  # 2 pages, the second holds one token
    a.free(req)
    assert sizes(a) == (4 * ps, 0, 0)
    a.check()
    again = a.alloc(4 * ps)
    assert again is not None
    assert {s // ps for s in req.tolist()} <= {s // ps for s in again.tolist()}


def _held_pages(ps: int):
    a = TokenAllocator(4 * ps, page_size=ps)
    return a, a.alloc(2 * ps)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_double_free_is_a_value_error_naming_the_slot(ps):
    a, held = _held_pages(ps)
    page0 = held[:ps]
    a.free(page0)
    before = sizes(a)
    s = int(page0[0])
    with pytest.raises(ValueError, match=f"slot {s}\\b.*freed while not allocated"):
        a.free(held)  # the second page is valid, the first already free: nothing is freed
    a.check()
    assert sizes(a) == before
    a.free(held[ps:])  # the valid page is still held, so it can be freed once
    assert sizes(a) == (4 * ps, 0, 0)
    a.check()


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("where", ["padding_first", "padding_last", "past_end", "negative"])
def test_foreign_slot_is_a_value_error_naming_the_slot(ps, where):
    a, held = _held_pages(ps)
    bad = {
        "padding_first": 0,
        "padding_last": ps - 1,
        "past_end": a.pool_slots,
        "negative": -1,
    }[where]
    before = sizes(a)
    with pytest.raises(ValueError, match=f"slot {bad} is not a slot of this pool"):
        a.free(torch.cat([held, t([bad])]))
    a.check()
    assert sizes(a) == before
    a.free(held)
    assert sizes(a) == (4 * ps, 0, 0)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_never_allocated_page_is_a_value_error(ps):
    a, held = _held_pages(ps)
    unheld = int(a.pool_slots - 1)  # the last page is still free (allocation takes low pages)
    assert unheld // ps not in {s // ps for s in held.tolist()}
    with pytest.raises(ValueError, match=f"slot {unheld}\\b.*not allocated"):
        a.free(t([unheld]))
    assert sizes(a) == (2 * ps, 0, 2 * ps)
    a.check()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_freeing_a_staged_page_again_is_a_value_error_and_changes_nothing(ps):
    a, held = _held_pages(ps)
    a.free_group_begin()
    a.free(held[:ps])
    before = sizes(a)
    assert before == (2 * ps, ps, ps)
    s = int(held[ps - 1])
    with pytest.raises(ValueError, match=f"slot {s}\\b.*already staged for freeing"):
        a.free(torch.cat([held[ps:], held[ps - 1 : ps]]))
    a.check()
    assert sizes(a) == before
    assert a.free_group_end() == ps
    a.free(held[ps:])  # the other page was left in use by the rejected free
    assert sizes(a) == (4 * ps, 0, 0)
    a.check()


# -- free groups ------------------------------------------------------------------------------


def test_group_begin_twice_and_end_without_begin_are_runtime_errors():
    a = TokenAllocator(16, page_size=4)
    with pytest.raises(RuntimeError, match="no free group is open"):
        a.free_group_end()
    a.free_group_begin()
    with pytest.raises(RuntimeError, match="already open"):
        a.free_group_begin()
    assert a.group_open
    assert a.free_group_end() == 0
    assert not a.group_open
    with pytest.raises(RuntimeError, match="no free group is open"):
        a.free_group_end()


@pytest.mark.parametrize("ps", [1, 4])
def test_frees_in_a_group_are_staged_and_not_handed_out(ps):
    a = TokenAllocator(6 * ps, page_size=ps)
    x, y = a.alloc(2 * ps), a.alloc(2 * ps)
    assert sizes(a) == (2 * ps, 0, 4 * ps)
    a.free_group_begin()
    a.free(x)
    a.check()
    assert sizes(a) == (2 * ps, 2 * ps, 2 * ps)  # staged grew, available did not
    a.free(y[:ps])
    a.check()
    assert sizes(a) == (2 * ps, 3 * ps, ps)
    staged_pages = {s // ps for s in x.tolist() + y[:ps].tolist()}
    assert a.alloc(3 * ps) is None  # 3 pages staged, only 2 free
    got = a.alloc(2 * ps)
    assert got is not None
    assert staged_pages.isdisjoint(s // ps for s in got.tolist()), "a staged page handed out"
    assert sizes(a) == (0, 3 * ps, 3 * ps)
    a.check()
    assert a.free_group_end() == 3 * ps
    assert sizes(a) == (3 * ps, 0, 3 * ps)
    a.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_flush_applies_staged_frees_and_keeps_the_group_open(ps):
    a = TokenAllocator(4 * ps, page_size=ps)
    x = a.alloc(4 * ps)
    a.free_group_begin()
    a.free(x[: 2 * ps])
    assert a.flush_free_group() == 2 * ps
    assert a.group_open
    assert sizes(a) == (2 * ps, 0, 2 * ps)
    a.check()
    assert a.flush_free_group() == 0  # nothing staged since
    a.free(x[2 * ps : 3 * ps])  # still staged: the group is open
    assert sizes(a) == (2 * ps, ps, ps)
    a.check()
    assert a.free_group_end() == ps  # only what was staged after the flush
    assert not a.group_open
    assert sizes(a) == (3 * ps, 0, ps)
    a.check()
    a.free(x[3 * ps :])  # outside a group: straight to the free list
    assert sizes(a) == (4 * ps, 0, 0)
    a.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_group_end_after_a_full_flush_frees_nothing_twice(ps):
    a = TokenAllocator(4 * ps, page_size=ps)
    x = a.alloc(4 * ps)
    a.free_group_begin()
    a.free(x)
    assert a.flush_free_group() == 4 * ps
    assert a.free_group_end() == 0
    a.check()
    assert sizes(a) == (4 * ps, 0, 0)
    # the pool is whole exactly once: all of it allocates, and then nothing more
    assert a.alloc(4 * ps) is not None
    assert a.alloc(ps) is None
    a.check()


# -- the staged-frees specimen ----------------------------------------------------------------
#
# The field failure: inside an open free group the cache evicts, its receipt says tokens were
# freed, yet the pool stays empty because the frees are only staged, and the next alloc fails.
# The fix at an allocation site is ``flush_free_group()``; the caller's ``free_group_end()``
# must then free nothing twice.

CAP, PS, SEQ = 64, 4, 16


def _full_pool_of_unlocked_cache() -> tuple[
    TokenAllocator, RadixCache, list[list[int]], list[list[int]]
]:
    """Four 16-token sequences cached, unlocked, filling the pool; seqs[0] is the LRU."""
    a = TokenAllocator(CAP, page_size=PS)
    cache = RadixCache(a, receipts=Receipts(capture=True))
    seqs = [[1000 * (i + 1) + j for j in range(SEQ)] for i in range(CAP // SEQ)]
    owned = []
    for toks in seqs:
        slots = a.alloc(SEQ)
        owned.append(slots.tolist())
        assert cache.insert(toks, slots) == SEQ
    assert a.available_size() == 0 and a.used_size() == CAP
    assert cache.evictable_size() == CAP and cache.protected_size() == 0
    a.check()
    cache.check()
    return a, cache, seqs, owned


def _evict_in_group(a: TokenAllocator, cache: RadixCache) -> None:
    a.free_group_begin()
    assert cache.evict(SEQ) == SEQ
    rec = cache.receipts.of(schema.EVICTION)
    assert len(rec) == 1
    assert rec[0]["evicted"] == SEQ and rec[0]["staged"] == SEQ
    assert rec[0]["asked"] == SEQ and rec[0]["available_after"] == 0
    assert rec[0]["evictable_before"] == CAP and rec[0]["evictable_after"] == CAP - SEQ
    assert schema.missing_fields(schema.EVICTION, rec[0]) == []
    assert cache.receipts.of(schema.EVICTION_UNDER_DELIVERED) == []


def test_specimen_red_eviction_in_an_open_group_does_not_feed_alloc():
    """The red state: eviction 'freed' 16 tokens, yet alloc(16) fails, with the numbers."""
    a, cache, _, _ = _full_pool_of_unlocked_cache()
    _evict_in_group(a, cache)
    assert a.alloc(SEQ) is None
    assert a.available_size() == 0
    assert a.staged_size() == SEQ
    assert a.used_size() == CAP - SEQ
    a.check()
    # only closing the group makes them usable (that is the caller's, much later)
    assert a.free_group_end() == SEQ
    assert a.alloc(SEQ) is not None
    a.check()


def test_specimen_green_flush_makes_the_evicted_tokens_allocatable():
    a, cache, seqs, owned = _full_pool_of_unlocked_cache()
    _evict_in_group(a, cache)
    assert a.flush_free_group() == SEQ
    assert a.group_open, "flush must leave the caller's group open"
    assert sizes(a) == (SEQ, 0, CAP - SEQ)
    got = a.alloc(SEQ)
    assert got is not None
    assert sorted(got.tolist()) == sorted(owned[0])  # exactly the evicted (LRU) pages
    assert cache.match_prefix(seqs[0]).length == 0
    assert all(cache.match_prefix(s).length == SEQ for s in seqs[1:])
    assert a.free_group_end() == 0  # nothing is freed twice
    assert not a.group_open
    assert sizes(a) == (0, 0, CAP)
    a.check()
    cache.check()


# -- a model-checked random walk --------------------------------------------------------------


class PagedAllocatorMachine(RuleBasedStateMachine):
    """Model: the slots each live owner holds (plain allocs and growing requests), the staged
    pages, and whether a group is open."""

    @initialize(ps=st.sampled_from([1, 4]), pages=st.integers(min_value=1, max_value=12))
    def setup(self, ps: int, pages: int) -> None:
        self.ps = ps
        self.a = TokenAllocator(pages * ps, page_size=ps)
        self.allocs: list[list[int]] = []
        self.reqs: dict[int, list[int]] = {}
        self.staged: set[int] = set()  # pages
        self.group = False

    # model helpers
    def owners(self) -> list[list[int]]:
        return self.allocs + list(self.reqs.values())

    def live_pages(self) -> set[int]:
        return {s // self.ps for o in self.owners() for s in o}

    def free_pages(self) -> int:
        return self.a.num_pages - len(self.live_pages()) - len(self.staged)

    def _free(self, slots: list[int]) -> None:
        self.a.free(torch.tensor(slots, dtype=torch.int64))
        if self.group:
            self.staged |= {s // self.ps for s in slots}

    def _check_new(self, new: list[int]) -> None:
        taken = {s // self.ps for s in new}
        assert taken.isdisjoint(self.live_pages()), "a live page was handed out again"
        assert taken.isdisjoint(self.staged), "a staged page was handed out"
        assert all(self.ps <= s < self.a.pool_slots for s in new)

    # rules
    @rule(k=st.integers(min_value=0, max_value=6))
    def alloc(self, k: int) -> None:
        free = self.free_pages()
        got = self.a.alloc(k * self.ps)
        if k > free:
            assert got is None
            return
        new = got.tolist()
        assert len(new) == k * self.ps
        assert_whole_pages(self.a, new)
        self._check_new(new)
        if new:
            self.allocs.append(new)

    @rule(rid=st.integers(min_value=0, max_value=2), extend=st.integers(min_value=0, max_value=9))
    def extend(self, rid: int, extend: int) -> None:
        slots = self.reqs.get(rid, [])
        held = len(slots)
        need = -(-(held + extend) // self.ps) - -(-held // self.ps)
        assert self.a.pages_needed(held, extend) == need
        free = self.free_pages()
        got = self.a.alloc_extend(held, extend, slots[-1] if slots else None)
        if need > free:
            assert got is None
            return
        new = got.tolist()
        assert len(new) == extend
        self._check_new([s for s in new if s // self.ps not in {x // self.ps for x in slots}])
        if slots or new:
            self.reqs[rid] = slots + new
            assert_request_layout(self.ps, self.reqs[rid])

    @precondition(lambda self: bool(self.reqs))
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        slots = self.reqs[rid]
        full = len(slots) % self.ps == 0
        free = self.free_pages()
        got = self.a.alloc_extend(len(slots), 1, slots[-1])
        if full and free == 0:
            assert got is None
            return
        assert got is not None and got.numel() == 1
        assert self.free_pages() == free  # model unchanged so far
        if full:
            self._check_new(got.tolist())
        slots.append(int(got))
        assert_request_layout(self.ps, slots)

    @precondition(lambda self: bool(self.allocs))
    @rule(data=st.data())
    def free_alloc(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(min_value=0, max_value=len(self.allocs) - 1))
        self._free(self.allocs.pop(i))

    @precondition(lambda self: bool(self.reqs))
    @rule(data=st.data())
    def free_request(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self._free(self.reqs.pop(rid))

    @precondition(lambda self: bool(self.staged))
    @rule(data=st.data())
    def free_staged_again(self, data: st.DataObject) -> None:
        page = data.draw(st.sampled_from(sorted(self.staged)))
        before = sizes(self.a)
        with pytest.raises(ValueError, match="already staged"):
            self.a.free(t([page * self.ps]))
        assert sizes(self.a) == before

    @rule()
    def begin(self) -> None:
        if self.group:
            with pytest.raises(RuntimeError):
                self.a.free_group_begin()
        else:
            self.a.free_group_begin()
            self.group = True

    @rule()
    def flush(self) -> None:
        assert self.a.flush_free_group() == len(self.staged) * self.ps
        self.staged.clear()

    @rule()
    def end(self) -> None:
        if not self.group:
            with pytest.raises(RuntimeError):
                self.a.free_group_end()
            return
        assert self.a.free_group_end() == len(self.staged) * self.ps
        self.staged.clear()
        self.group = False

    # invariants
    @invariant()
    def ledger(self) -> None:
        if not hasattr(self, "a"):
            return
        a, ps = self.a, self.ps
        a.check()
        assert a.available_size() + a.staged_size() + a.used_size() == a.capacity
        assert a.used_size() == len(self.live_pages()) * ps
        assert a.staged_size() == len(self.staged) * ps
        assert a.available_size() == self.free_pages() * ps
        assert a.group_open == self.group
        assert self.group or not self.staged  # staged pages only exist inside a group

    @invariant()
    def owners_are_disjoint(self) -> None:
        if not hasattr(self, "a"):
            return
        seen: set[int] = set()
        for o in self.owners():
            pages = {s // self.ps for s in o}
            assert 0 not in pages, "the padding page is owned"
            assert seen.isdisjoint(pages), "a page is held by two live owners"
            seen |= pages

    @invariant()
    def all_available_allocates_at_once(self) -> None:
        if not hasattr(self, "a"):
            return
        twin = copy.deepcopy(self.a)
        n = twin.available_size()
        got = twin.alloc(n)
        assert got is not None, f"available_size() says {n} but alloc({n}) fails"
        assert got.numel() == n
        self._check_new(got.tolist())
        assert twin.available_size() == 0
        twin.check()


PagedAllocatorMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestPagedAllocatorMachine = PagedAllocatorMachine.TestCase


def test_alloc_extend_rejects_a_last_slot_that_is_not_the_requests_own():
    from engine.memory.allocator import TokenAllocator

    a = TokenAllocator(64, page_size=4)
    mine = a.alloc_extend(0, 3, None)  # tokens 0..2 on one page, one slot left
    with pytest.raises(ValueError, match="is not token 2 of an allocated page"):
        a.alloc_extend(3, 2, int(mine[1]))  # the slot of token 1, not token 2
    with pytest.raises(ValueError, match="is not token 2 of an allocated page"):
        a.alloc_extend(3, 2, 4 * 9 + 2)  # right offset, but a page nobody holds
    more = a.alloc_extend(3, 2, int(mine[2]))
    assert int(more[0]) == int(mine[2]) + 1
    a.check()
