"""PublishedGroup and the memory's agreed numbers over a scripted peer: what a rank reads once the floor is
published, when it writes group.floor, and how a digest mismatch is caught."""

from __future__ import annotations

from collections import deque

import pytest

from engine.observability.receipts import Receipts
from engine.scheduler.admission import NewTokenRatio
from engine.scheduler.group import NONE, GroupSplit, PublishedGroup
from engine.scheduler.memory import Memory


class Peer:
    """A comm whose one other rank holds ``theirs`` (ints, element-wise) and ``digest``."""

    world = 2
    rank = 0

    def __init__(self, theirs: list[int], digest: list[int] | None = None) -> None:
        self.theirs, self.digest = theirs, digest

    def min_ints(self, values: list[int]) -> list[int]:
        other = self.theirs if len(values) == len(self.theirs) else self.theirs[: len(values)]
        return [min(a, b) for a, b in zip(values, other)]

    def gather_ints(self, values: list[int]) -> list[list[int]]:
        return [list(values), list(self.digest if self.digest is not None else values)]


class Pool:
    page_size = 1

    def __init__(self, available: int, evictable: int, staged: int, capacity: int) -> None:
        self.available, self.evictable, self.staged, self.capacity = (
            available,
            evictable,
            staged,
            capacity,
        )

    def available_size(self) -> int:
        return self.available

    def staged_size(self) -> int:
        return self.staged

    def evictable_size(self) -> int:
        return self.evictable


def agreed(pool: Pool, group) -> Memory:
    """The memory over ``pool`` (its allocator and its cache at once), reading ``group``."""
    return Memory(pool, None, pool, group, Receipts(), ([], deque()), NewTokenRatio(), ladder=False)


def group(theirs: list[int], reads_floor: bool = True, digest=None):
    r = Receipts(capture=True)
    return PublishedGroup(Peer(theirs, digest), r, 1024, 1, reads_floor), r


def test_the_larger_rank_reads_the_smaller_ranks_numbers_and_says_the_floor_binds():
    g, r = group([640])  # capacity 640 first, then the peer's terms
    assert g.capacity(1024) == 640
    pool = Pool(available=900, evictable=300, staged=10, capacity=1024)
    view = agreed(pool, g)
    g.comm.theirs = [300, 300, 40, 600]
    floor = g.publish(view.local(), r)
    assert floor == 600 and view.capacity == 640
    assert (view.available(), view.evictable(), view.staged()) == (300, 300, 10)
    pool.available -= 100  # a chunk both ranks take: the agreed numbers move alike
    assert view.available() == 200
    assert g.floor_now(view.terms()) == 500
    (rec,) = r.of("group.floor")
    assert rec["floor"] == 600 and rec["local"] == 1200 and rec["available"] == 300


def test_the_smallest_rank_reads_its_own_numbers_and_writes_no_floor_receipt():
    g, r = group([2048])
    pool = Pool(available=300, evictable=300, staged=0, capacity=640)
    view = agreed(pool, g)
    g.comm.theirs = [900, 300, 10, 1200]
    assert g.publish(view.local(), r) == 600
    assert g.surplus == NONE  # every MIN is this rank's own
    assert view.available() == 300 and r.of("group.floor") == []


def test_the_test_switch_reads_the_ranks_own_pool():
    g, r = group([2048], reads_floor=False)
    view = agreed(Pool(900, 300, 0, 1024), g)
    g.comm.theirs = [300, 300, 0, 600]
    g.publish(view.local(), r)
    assert g.surplus == NONE and view.available() == 900
    assert g.floor_now(view.terms()) is None


def test_different_digests_are_a_split_on_every_rank_before_the_forward():
    g, r = group([2048], digest=[1, 2])
    with pytest.raises(GroupSplit, match="iteration 7"):
        g.agree(7, "00000001" + "00000003")
    (v,) = r.of("invariant.violation")
    assert v["what"] == "group_split" and v["digests"] == ["0000000100000003", "0000000100000002"]


def test_equal_digests_pass_and_only_every_k_iterations_are_compared():
    g, r = group([2048], digest=[1, 2])
    g.check_every = 4
    g.agree(7, "0000000100000003")  # not a checked iteration: nothing compared
    g.agree(8, "0000000100000002")  # checked, equal
    assert r.of("invariant.violation") == []
