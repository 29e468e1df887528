"""A decode step's slots taken at once (``TokenAllocator.alloc_decode``): the same pages as a
call per request would take, nothing taken when they do not all fit."""

from __future__ import annotations

import pytest
import torch

from engine.memory.allocator import TokenAllocator


@pytest.mark.parametrize("page", [1, 4])
def test_each_request_continues_its_last_page_or_takes_a_fresh_one(page):
    a = TokenAllocator(64, page)
    held = [3, 4, 5, 8]
    last = []
    for h in held:  # each request's tokens so far
        slots = a.alloc_extend(0, h, None)
        last.append(int(slots[-1]))
    used = a.used_size()
    got = a.alloc_decode(held, last).tolist()
    fresh = sum(1 for h in held if h % page == 0)
    assert a.used_size() == used + fresh * page
    assert len(set(got)) == len(got)
    for h, s, g in zip(held, last, got):
        if h % page:
            assert g == s + 1  # room left on its last page
        else:
            assert g % page == 0 and g // page != s // page  # the first slot of a fresh page
    a.check()


def test_nothing_is_taken_when_the_fresh_pages_do_not_all_fit():
    a = TokenAllocator(4, 1)
    a.alloc(2)
    before = a.available_size()
    assert a.alloc_decode([1, 1, 1], [None, None, None]) is None
    assert a.available_size() == before
    got = a.alloc_decode([1, 1], [None, None])
    assert got is not None and a.available_size() == 0


def test_a_wrong_last_slot_is_refused_before_anything_is_taken():
    a = TokenAllocator(16, 4)
    slots = a.alloc_extend(0, 3, None)
    before = a.available_size()
    with pytest.raises(ValueError, match="not token 2's"):
        a.alloc_decode([3, 4], [int(slots[0]), None])
    assert a.available_size() == before
    assert a.alloc_decode([3], [int(slots[-1])]).tolist() == [int(slots[-1]) + 1]
    assert isinstance(a.alloc_decode([], []), torch.Tensor)


def test_write_each_puts_one_slot_at_each_rows_position_and_nothing_else():
    from engine.memory.req_table import ReqToTokenPool

    t = ReqToTokenPool(4, 8)
    t.write_each([2, 0, 3], [5, 0, 7], torch.tensor([11, 12, 13]))
    want = torch.zeros(4, 8, dtype=torch.int64)
    want[2, 5], want[0, 0], want[3, 7] = 11, 12, 13
    assert torch.equal(t.table, want)
    with pytest.raises(ValueError, match="context 9 exceeds the table width 8"):
        t.write_each([1], [8], torch.tensor([4]))
