"""TokenAllocator and ReqToTokenPool: the KV slot ledger and the request-row table."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.memory.allocator import TokenAllocator
from engine.memory.req_table import ReqTableFull, ReqToTokenPool

# -- TokenAllocator ---------------------------------------------------------------------------


def test_alloc_hands_out_distinct_slots_in_range():
    a = TokenAllocator(10)
    got = [a.alloc(3), a.alloc(4), a.alloc(3)]
    a.check()
    slots = torch.cat(got).tolist()
    assert sorted(slots) == list(range(1, 11))  # slot 0 (padding) never handed out
    assert a.available_size() == 0 and a.used_size() == 10
    assert a.alloc(1) is None


def test_alloc_zero_is_empty_and_negative_is_an_error():
    a = TokenAllocator(4)
    assert a.alloc(0).numel() == 0
    with pytest.raises(ValueError, match="-1"):
        a.alloc(-1)
    assert a.available_size() == 4
    a.check()


def test_alloc_is_never_partial():
    a = TokenAllocator(8)
    held = a.alloc(5)
    assert a.alloc(4) is None  # only 3 free: nothing is taken
    assert a.available_size() == 3 and a.used_size() == 5
    a.check()
    rest = a.alloc(3)
    assert rest is not None
    assert set(rest.tolist()).isdisjoint(held.tolist())
    a.check()


def test_free_returns_slots_for_reuse():
    a = TokenAllocator(6)
    first = a.alloc(6)
    a.free(first[[1, 4]])
    a.check()
    assert a.available_size() == 2
    again = a.alloc(2)
    assert sorted(again.tolist()) == sorted(first[[1, 4]].tolist())
    a.free(torch.tensor([], dtype=torch.int64))  # freeing nothing is fine
    a.check()
    assert a.used_size() == 6


@pytest.mark.parametrize(
    ("slots", "message"),
    [
        ([0], "slot 0 is not a slot of this pool"),
        ([9], "slot 9 is not a slot of this pool"),  # capacity + 1
        ([2, -3], "slot -3 is not a slot of this pool"),
        ([5], r"slot 5 freed while not allocated \(double free\?\)"),  # never allocated
        ([2, 2], "slot 2 appears twice in one free"),
        ([1, 3, 2, 3], "slot 3 appears twice in one free"),
    ],
)
def test_bad_free_raises_naming_the_slot_and_changes_nothing(slots, message):
    a = TokenAllocator(8)
    held = a.alloc(4)
    assert sorted(held.tolist()) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match=message):
        a.free(torch.tensor(slots))
    a.check()
    assert a.used_size() == 4  # a rejected free frees none of its valid slots either
    a.free(held)
    a.check()
    assert a.available_size() == 8


def test_double_free_raises_naming_the_slot():
    a = TokenAllocator(5)
    s = a.alloc(3)
    a.free(s[1:2])
    with pytest.raises(ValueError, match=f"slot {int(s[1])} freed while not allocated"):
        a.free(s)
    a.check()
    assert a.used_size() == 2


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        TokenAllocator(0)


def test_random_alloc_free_sequences_keep_the_ledger():
    """A long seeded random walk: every step keeps free + in use == capacity and never hands
    out a slot that is still in use."""
    rng = torch.Generator().manual_seed(0)
    cap = 37
    a = TokenAllocator(cap)
    held: list[torch.Tensor] = []
    for _ in range(600):
        in_use = {int(s) for h in held for s in h}
        if held and torch.rand(1, generator=rng).item() < 0.45:
            i = int(torch.randint(len(held), (1,), generator=rng))
            a.free(held.pop(i))
        else:
            n = int(torch.randint(0, 12, (1,), generator=rng))
            got = a.alloc(n)
            if n > cap - len(in_use):
                assert got is None
            else:
                vals = got.tolist()
                assert len(set(vals)) == n
                assert all(1 <= s <= cap for s in vals)
                assert in_use.isdisjoint(vals)
                held.append(got)
        a.check()
        assert a.used_size() == sum(h.numel() for h in held)


class AllocatorMachine(RuleBasedStateMachine):
    """Model: the set of slots each live allocation holds."""

    @initialize(cap=st.integers(min_value=1, max_value=24))
    def setup(self, cap: int) -> None:
        self.cap = cap
        self.a = TokenAllocator(cap)
        self.held: list[list[int]] = []

    def in_use(self) -> set[int]:
        return {s for h in self.held for s in h}

    @rule(n=st.integers(min_value=0, max_value=30))
    def alloc(self, n: int) -> None:
        before = self.a.available_size()
        got = self.a.alloc(n)
        if n > before:
            assert got is None
            assert self.a.available_size() == before
            return
        vals = got.tolist()
        assert len(vals) == n == len(set(vals))
        assert all(1 <= s <= self.cap for s in vals)
        assert self.in_use().isdisjoint(vals), "a slot was handed out twice"
        self.held.append(vals)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(min_value=0, max_value=len(self.held) - 1))
        self.a.free(torch.tensor(self.held.pop(i), dtype=torch.int64))

    @rule(data=st.data())
    def bad_free(self, data: st.DataObject) -> None:
        """A free naming any slot not in use (or foreign) is rejected and changes nothing."""
        not_in_use = sorted({0, self.cap + 1} | (set(range(1, self.cap + 1)) - self.in_use()))
        bad = data.draw(st.sampled_from(not_in_use))
        good = sorted(self.in_use())
        extra = data.draw(st.lists(st.sampled_from(good), max_size=3, unique=True)) if good else []
        with pytest.raises(ValueError, match=f"slot {bad} "):
            self.a.free(torch.tensor([*extra, bad], dtype=torch.int64))

    @invariant()
    def ledger(self) -> None:
        if not hasattr(self, "a"):
            return
        self.a.check()
        used = len(self.in_use())
        assert self.a.used_size() == used
        assert self.a.available_size() + used == self.cap


AllocatorMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestAllocatorMachine = AllocatorMachine.TestCase


# -- ReqToTokenPool ---------------------------------------------------------------------------


def test_req_table_full_after_all_rows():
    pool = ReqToTokenPool(rows=3, max_context=8)
    rows = {pool.alloc() for _ in range(3)}
    assert rows == {0, 1, 2}
    assert pool.available_rows() == 0
    with pytest.raises(ReqTableFull, match="all 3 request rows are in use"):
        pool.alloc()
    pool.free(1)
    assert pool.alloc() == 1


@pytest.mark.parametrize("row", [-1, 3, 0])
def test_free_of_a_row_not_allocated_raises(row):
    pool = ReqToTokenPool(rows=3, max_context=8)
    pool.alloc()  # takes row 2
    with pytest.raises(ValueError, match=f"request row {row} is not allocated"):
        pool.free(row)
    assert pool.available_rows() == 2


def test_double_free_of_a_row_raises():
    pool = ReqToTokenPool(rows=2, max_context=4)
    r = pool.alloc()
    pool.free(r)
    with pytest.raises(ValueError, match=f"request row {r} is not allocated"):
        pool.free(r)
    assert pool.available_rows() == 2


def test_write_and_read_slots():
    pool = ReqToTokenPool(rows=2, max_context=6)
    r = pool.alloc()
    pool.write(r, 0, torch.tensor([7, 3, 9]))
    pool.write(r, 3, torch.tensor([4, 5, 11]))  # fills the row exactly to its width
    got = pool.slots(r, 6)
    assert got.tolist() == [7, 3, 9, 4, 5, 11]
    got[0] = 99  # a copy, not a view of the table
    assert pool.slots(r, 1).tolist() == [7]


def test_write_beyond_width_raises_and_writes_nothing():
    pool = ReqToTokenPool(rows=2, max_context=6)
    r = pool.alloc()
    pool.write(r, 0, torch.tensor([1, 2, 3, 4]))
    with pytest.raises(ValueError, match="context 7 exceeds the table width 6"):
        pool.write(r, 4, torch.tensor([5, 6, 7]))
    assert pool.slots(r, 6).tolist() == [1, 2, 3, 4, 0, 0]
