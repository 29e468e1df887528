"""RadixCache: page-aligned prefix matching, locks, LRU eviction, honest counters, receipts and
the shape() walk, with a stateful property test that keeps the allocator ledger in view."""

from __future__ import annotations

import copy
import random
import sys
import types

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import engine.memory.radix as radix_module
from engine.memory.allocator import IN_USE, TokenAllocator
from engine.memory.radix import RadixCache, TreeNode
from engine.observability import schema
from engine.observability.receipts import Receipts

# -- helpers ----------------------------------------------------------------------------------


def make(capacity: int, page_size: int, **kw) -> tuple[TokenAllocator, RadixCache, Receipts]:
    a = TokenAllocator(capacity, page_size)
    rec = Receipts(capture=True)
    return a, RadixCache(a, receipts=rec, **kw), rec


def aligned(n: int, page_size: int) -> int:
    return n - n % page_size


def put(a: TokenAllocator, c: RadixCache, tokens: list[int]) -> tuple[torch.Tensor, int]:
    """What a finished request does: fresh slots for all its tokens, hand them to the cache,
    free the unaligned private tail itself. Returns (the slots it had, tokens newly cached)."""
    slots = a.alloc_extend(0, len(tokens), None)
    assert slots is not None, "test set-up: allocator too small"
    added = c.insert(tokens, slots)
    a.free(slots[aligned(len(tokens), a.page_size) :])
    return slots, added


def put_hit(a: TokenAllocator, c: RadixCache, tokens: list[int]) -> int:
    """What a request with a cache hit does: fresh slots only past the cached prefix, so
    nothing is a duplicate. Returns the tokens newly cached."""
    m = c.match_prefix(tokens)
    new = a.alloc_extend(m.length, len(tokens) - m.length, None)
    assert new is not None, "test set-up: allocator too small"
    added = c.insert(tokens, torch.cat([m.slots, new]))
    a.free(new[aligned(len(tokens), a.page_size) - m.length :])
    return added


def path_tokens(node: TreeNode) -> list[int]:
    """The tokens from the root down to ``node`` (inclusive), read through parent pointers."""
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return [t for part in reversed(parts) for t in part]


def node_of(c: RadixCache, tokens: list[int]) -> TreeNode:
    m = c.match_prefix(tokens)
    assert m.length == len(tokens), "test set-up: prefix not cached"
    return m.node


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch):
    """Replace the radix module's clock: ``clock.frozen = True`` makes every reading equal (a
    coarse monotonic clock), otherwise each reading advances by a microsecond."""
    state = types.SimpleNamespace(now=1000.0, frozen=False)

    def monotonic() -> float:
        if not state.frozen:
            state.now += 1e-6
        return state.now

    monkeypatch.setattr(radix_module, "time", types.SimpleNamespace(monotonic=monotonic))
    return state


# -- basics -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ps", [1, 4])
def test_insert_then_match_returns_cached_prefix_and_its_slots(ps):
    a, c, _ = make(64, ps)
    tokens = [7, 3, 9, 1] * ps  # 4 pages
    slots, added = put(a, c, tokens)
    assert added == 4 * ps
    assert c.total_size() == c.evictable_size() == 4 * ps and c.protected_size() == 0
    assert a.used_size() == 4 * ps  # the cache owns exactly the cached slots

    m = c.match_prefix(tokens + [5, 5])  # the query runs past what is cached
    assert m.length == 4 * ps
    assert m.slots.tolist() == slots[: 4 * ps].tolist()
    assert m.node.key == tokens and m.node.parent is c.root

    miss = c.match_prefix([8] * ps + tokens)
    assert miss.length == 0 and miss.node is c.root
    # a query diverging inside the second page matches only the first page
    query = tokens[:ps] + tokens[ps : ps + ps // 2] + [99] * ps
    m = c.match_prefix(query)
    assert m.length == ps
    assert m.slots.tolist() == slots[:ps].tolist()
    c.check()
    a.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_match_ending_inside_a_node_splits_it(ps):
    a, c, _ = make(64, ps)
    tokens = list(range(10, 10 + 4 * ps))
    slots, _ = put(a, c, tokens)
    assert c.shape().nodes == 1

    m = c.match_prefix(tokens[: 2 * ps] + [0] * ps)
    assert m.length == 2 * ps
    assert c.shape().nodes == 2
    upper = m.node
    assert upper.key == tokens[: 2 * ps]
    assert upper.value.tolist() == slots[: 2 * ps].tolist()
    assert upper.parent is c.root
    (lower,) = upper.children.values()
    assert lower.key == tokens[2 * ps :] and lower.value.tolist() == slots[2 * ps :].tolist()
    assert lower.parent is upper
    assert c.total_size() == 4 * ps  # a split moves no token

    # a match that ends on a node boundary does not split again
    assert c.match_prefix(tokens[: 2 * ps]).node is upper
    assert c.match_prefix(tokens).node is lower
    assert c.shape().nodes == 2
    c.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_insert_of_cached_prefix_with_different_slots_frees_the_duplicates(ps):
    a, c, _ = make(64, ps)
    head = [1, 2, 3] * ps  # 3 pages
    first, _ = put(a, c, head)

    tokens = head + [4, 5] * ps  # head again, then 2 new pages
    other = a.alloc_extend(0, len(tokens), None)
    avail = a.available_size()
    added = c.insert(tokens, other)
    assert added == 2 * ps
    assert a.available_size() - avail == 3 * ps  # exactly the duplicate slots came back
    m = c.match_prefix(tokens)
    assert m.slots.tolist() == first[: 3 * ps].tolist() + other[3 * ps :].tolist()
    assert a.used_size() == c.total_size() == 5 * ps
    c.check()
    a.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_insert_of_cached_prefix_with_the_same_slots_frees_nothing(ps):
    a, c, _ = make(64, ps)
    head = [1, 2, 3] * ps
    put(a, c, head)

    m = c.match_prefix(head + [9, 9] * ps)  # what a request with a cache hit does
    assert m.length == 3 * ps
    new = a.alloc_extend(m.length, 2 * ps, None)
    avail = a.available_size()
    added = c.insert(head + [9, 9] * ps, torch.cat([m.slots, new]))
    assert added == 2 * ps
    assert a.available_size() == avail  # nothing freed: the cache kept the very same slots
    assert c.insert(head, m.slots) == 0  # a pure re-insert adds nothing and frees nothing
    assert a.available_size() == avail
    assert a.used_size() == c.total_size() == 5 * ps
    c.check()
    a.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_insert_returns_newly_cached_tokens_across_branches(ps):
    a, c, _ = make(128, ps)
    assert put(a, c, [1] * (3 * ps))[1] == 3 * ps
    assert put(a, c, [1] * ps + [2] * (2 * ps))[1] == 2 * ps  # branches after one page
    assert put(a, c, [1] * (3 * ps))[1] == 0
    assert put(a, c, [1] * (4 * ps))[1] == ps  # extends a leaf
    assert c.total_size() == 6 * ps
    s = c.shape()
    assert (s.nodes, s.leaves, s.depth) == (4, 2, 3)
    c.check()


@pytest.mark.parametrize("ps", [2, 4])
def test_unaligned_tail_is_not_cached(ps):
    a, c, _ = make(64, ps)
    tokens = [3] * (2 * ps) + [4] * (ps - 1)  # two pages and a partial one
    slots = a.alloc_extend(0, len(tokens), None)
    assert c.insert(tokens, slots) == 2 * ps
    assert c.total_size() == 2 * ps
    assert a.used_size() == 3 * ps  # the partial page is still the caller's
    assert c.match_prefix(tokens).length == 2 * ps
    a.free(slots[2 * ps :])
    assert a.used_size() == c.total_size()

    short = [5] * (ps - 1)  # less than a page: nothing to cache
    s2 = a.alloc_extend(0, len(short), None)
    assert c.insert(short, s2) == 0
    assert c.match_prefix(short).length == 0
    a.free(s2)
    assert c.total_size() == a.used_size() == 2 * ps
    c.check()
    a.check()


# -- locks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ps", [1, 4])
def test_lock_on_a_deep_node_protects_the_whole_path(ps):
    a, c, _ = make(128, ps)
    chain = [1] * (2 * ps) + [2] * (2 * ps) + [3] * ps  # nodes of 2, 2 and 1 pages
    put(a, c, chain[: 2 * ps])
    put(a, c, chain[: 4 * ps])
    put(a, c, chain)
    put(a, c, [9] * ps)  # an unrelated leaf
    assert c.shape().nodes == 4 and c.evictable_size() == 6 * ps

    deep = node_of(c, chain)
    c.inc_lock_ref(deep)
    assert c.protected_size() == 5 * ps  # every token on the path
    assert c.evictable_size() == ps
    c.check()

    assert c.evict(c.evictable_size()) == ps
    assert c.evictable_size() == 0
    assert c.evict(10**6) == 0  # asking for more finds nothing more either
    assert c.total_size() == 5 * ps == a.used_size()
    assert c.match_prefix(chain).length == 5 * ps  # nothing on the locked path went
    assert c.match_prefix([9] * ps).length == 0

    c.dec_lock_ref(deep)
    assert c.protected_size() == 0 and c.evictable_size() == 5 * ps
    assert c.evict(c.evictable_size()) == 5 * ps
    assert c.total_size() == a.used_size() == 0
    c.check()
    a.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_evict_everything_spares_locked_nodes_and_their_ancestors(ps):
    a, c, _ = make(256, ps)
    base = [1] * ps
    mid = base + [2] * ps
    for tail in ([3], [4], [5]):
        put(a, c, mid + tail * ps)  # three leaves under mid
    put(a, c, base + [6] * ps)  # a sibling of mid
    put(a, c, [7] * (2 * ps))  # another root child
    locked = node_of(c, mid)  # an inner node
    c.inc_lock_ref(locked)
    leaf = node_of(c, [7] * (2 * ps))  # a leaf, locked right after the match touched it
    c.inc_lock_ref(leaf)
    assert c.protected_size() == 4 * ps

    freed = c.evict(c.evictable_size())
    assert freed == 4 * ps
    assert c.evict(10**6) == 0  # the locked leaf's heap entry is still current: skip it anyway
    assert c.total_size() == c.protected_size() == 4 * ps == a.used_size()
    s = c.shape()
    assert (s.nodes, s.locked_nodes, s.leaves) == (3, 3, 2)
    assert c.match_prefix(mid).node is locked and path_tokens(locked) == mid
    assert c.match_prefix([7] * (2 * ps)).node is leaf and leaf.parent is c.root
    c.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_split_under_a_lock_copies_the_lock_to_the_upper_half(ps):
    a, c, _ = make(64, ps)
    tokens = list(range(1, 1 + 4 * ps))
    put(a, c, tokens)
    whole = node_of(c, tokens)
    c.inc_lock_ref(whole)
    c.inc_lock_ref(whole)
    counters = (c.total_size(), c.evictable_size(), c.protected_size())
    assert counters == (4 * ps, 0, 4 * ps)

    upper = c.match_prefix(tokens[:ps]).node
    assert upper is not whole and whole.parent is upper
    assert upper.lock_ref == whole.lock_ref == 2
    assert (c.total_size(), c.evictable_size(), c.protected_size()) == counters
    c.check()
    assert c.evict(10**6) == 0  # neither half can go

    c.dec_lock_ref(whole)
    c.dec_lock_ref(whole)
    assert upper.lock_ref == whole.lock_ref == 0
    assert (c.evictable_size(), c.protected_size()) == (4 * ps, 0)
    c.check()
    assert c.evict(c.evictable_size()) == 4 * ps


def test_split_above_a_locked_descendant_copies_its_lock():
    a, c, _ = make(64, 1)
    put(a, c, [1, 2, 3, 4, 5, 6])
    put(a, c, [1, 2, 3, 4, 5, 6, 7, 8])
    leaf = node_of(c, [1, 2, 3, 4, 5, 6, 7, 8])
    c.inc_lock_ref(leaf)
    upper = c.match_prefix([1, 2]).node  # splits the leaf's parent
    assert upper.lock_ref == 1 and upper.key == [1, 2]
    assert c.protected_size() == 8 and c.evictable_size() == 0
    c.check()
    c.dec_lock_ref(leaf)
    assert c.protected_size() == 0 and c.evictable_size() == 8
    c.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_dec_lock_ref_below_zero_raises_and_changes_nothing(ps):
    a, c, _ = make(64, ps)
    put(a, c, [1] * (2 * ps))
    put(a, c, [1] * (3 * ps))
    parent, leaf = node_of(c, [1] * (2 * ps)), node_of(c, [1] * (3 * ps))
    with pytest.raises(RuntimeError, match="unlocked"):
        c.dec_lock_ref(leaf)
    c.inc_lock_ref(leaf)
    c.dec_lock_ref(leaf)
    with pytest.raises(RuntimeError, match="unlocked"):
        c.dec_lock_ref(leaf)
    c.inc_lock_ref(parent)  # the parent is locked, the leaf is not
    with pytest.raises(RuntimeError, match="unlocked"):
        c.dec_lock_ref(leaf)
    assert (parent.lock_ref, leaf.lock_ref) == (1, 0)
    assert c.protected_size() == 2 * ps and c.evictable_size() == ps
    c.check()


# -- LRU --------------------------------------------------------------------------------------


def evicted_order(c: RadixCache, candidates: dict[str, list[int]], steps: int) -> list[str]:
    """Evict one token at a time (so one whole node each) and name the root child that went."""
    out = []
    for _ in range(steps):
        before = set(c.root.children)
        assert c.evict(1) > 0
        (gone,) = before - set(c.root.children)
        out += [name for name, toks in candidates.items() if tuple(toks[: c.page_size]) == gone]
    return out


@pytest.mark.parametrize("frozen", [False, True], ids=["advancing-clock", "frozen-clock"])
@pytest.mark.parametrize("ps", [1, 4])
def test_evict_frees_least_recently_matched_leaf_first(clock, ps, frozen):
    """LRU is by use, not by insertion; it must hold even when a coarse clock returns the same
    reading for many operations (the heap's tie-breaker has to carry the order then)."""
    clock.frozen = frozen
    a, c, _ = make(128, ps)
    leaves = {name: [i + 1] * (2 * ps) for i, name in enumerate("ABCD")}
    for toks in leaves.values():
        put(a, c, toks)
    for name in "CADB":
        assert c.match_prefix(leaves[name]).length == 2 * ps
    assert evicted_order(c, leaves, 4) == list("CADB")
    assert c.total_size() == a.used_size() == 0


@pytest.mark.parametrize("frozen", [False, True], ids=["advancing-clock", "frozen-clock"])
def test_unlock_counts_as_a_use_for_lru(clock, frozen):
    clock.frozen = frozen
    a, c, _ = make(64, 1)
    leaves = {"A": [1, 1], "B": [2, 2], "C": [3, 3]}
    for toks in leaves.values():
        put(a, c, toks)
    a_node = node_of(c, leaves["A"])
    c.inc_lock_ref(a_node)
    c.match_prefix(leaves["B"])
    c.match_prefix(leaves["C"])
    c.dec_lock_ref(a_node)  # released last: now the most recently used
    assert evicted_order(c, leaves, 3) == list("BCA")


@pytest.mark.parametrize("ps", [1, 4])
def test_parents_that_become_unlocked_leaves_are_evicted_in_turn(clock, ps):
    a, c, _ = make(128, ps)
    chain = [1] * ps + [2] * ps
    put(a, c, chain[:ps])
    put(a, c, chain)
    put(a, c, [3] * ps)
    c.match_prefix(chain)  # touches both nodes of the chain
    c.match_prefix([3] * ps)  # the newest
    # the chain's leaf is the LRU leaf; once it is gone its parent is the LRU leaf
    assert c.evict(2 * ps) == 2 * ps
    assert c.match_prefix(chain).length == 0
    assert c.match_prefix([3] * ps).length == ps

    put(a, c, chain[:ps])
    put(a, c, chain)
    c.match_prefix([3] * ps)  # now the chain is older, but only its lower node is a leaf
    upper = c.root.children[(1,) * ps]
    assert c.evict(ps) == ps
    assert c.root.children[(1,) * ps] is upper and not upper.children  # the leaf went
    assert c.evict(ps) == ps  # then the parent, now a leaf and older than [3]
    assert set(c.root.children) == {(3,) * ps}
    assert c.total_size() == a.used_size() == ps
    c.check()


# -- disabled ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ps", [1, 4])
def test_disabled_cache_caches_nothing_and_frees_what_it_is_given(ps):
    a, c, rec = make(64, ps, disabled=True)
    tokens = [1, 2] * (2 * ps)
    slots = a.alloc(4 * ps)
    assert c.insert(tokens, slots) == 0
    assert a.available_size() == a.capacity  # every given slot went back
    assert c.total_size() == c.evictable_size() == 0
    m = c.match_prefix(tokens)
    assert m.length == 0 and m.node is c.root
    assert c.evict(10) == 0
    assert c.shape().nodes == 0
    assert [r["evicted"] for r in rec.of(schema.EVICTION)] == [0]
    assert rec.of(schema.EVICTION_UNDER_DELIVERED) == []
    a.check()
    c.check()


# -- receipts ---------------------------------------------------------------------------------

EVICTION_FIELDS = ("reason", "asked", "evicted", "staged", "evictable_before", "evictable_after")


@pytest.mark.parametrize("ps", [1, 4])
def test_every_evict_writes_an_eviction_receipt(ps):
    a, c, rec = make(256, ps)
    for i in range(6):
        put(a, c, [i + 1] * (2 * ps))  # six leaves of 2 pages
    c.inc_lock_ref(node_of(c, [6] * (2 * ps)))

    assert c.evict(0) == 0
    assert rec.of(schema.EVICTION) == []  # evict(0) is not an eviction

    got = c.evict(1, reason="pressure")
    (r,) = rec.of(schema.EVICTION)
    assert {k: r[k] for k in EVICTION_FIELDS} == {
        "reason": "pressure",
        "asked": 1,
        "evicted": got,
        "staged": 0,
        "evictable_before": 10 * ps,
        "evictable_after": 8 * ps,
    }
    assert got == 2 * ps  # a whole node, more than asked

    a.free_group_begin()
    avail = a.available_size()
    got = c.evict(3 * ps)
    r = rec.of(schema.EVICTION)[-1]
    assert got == 4 * ps
    assert r["staged"] == 4 * ps == a.staged_size()  # freed into the open group
    assert a.available_size() == avail
    assert (r["evictable_before"], r["evictable_after"]) == (8 * ps, 4 * ps)
    a.free_group_end()

    got = c.evict(10**6)  # more than there is: all of it, no under-delivery
    r = rec.of(schema.EVICTION)[-1]
    assert (got, r["asked"], r["evicted"], r["evictable_after"]) == (4 * ps, 10**6, 4 * ps, 0)
    assert r["reason"] == "requested"
    assert c.evict(5) == 0  # only the locked node is left
    assert len(rec.of(schema.EVICTION)) == 4
    assert rec.of(schema.EVICTION_UNDER_DELIVERED) == []


@pytest.mark.parametrize("ps", [1, 4])
def test_under_delivered_receipt_fires_exactly_when_the_counter_lies(ps):
    a, c, rec = make(128, ps)
    for i in range(3):
        put(a, c, [i + 1] * (2 * ps))  # 6 pages, all evictable
    c._evictable += 7  # corrupt: the counter now promises 7 tokens the tree does not hold
    real = 6 * ps

    assert c.evict(2 * ps) == 2 * ps  # asked less than there is: paid in full
    assert rec.of(schema.EVICTION_UNDER_DELIVERED) == []

    before = c.evictable_size()
    assert before == real - 2 * ps + 7
    got = c.evict(before)  # asked exactly what the counter promises
    assert got == real - 2 * ps
    (u,) = rec.of(schema.EVICTION_UNDER_DELIVERED)
    assert (u["asked"], u["evicted"], u["evictable_before"]) == (before, got, before)
    assert u["reason"] == "requested" and u["note"]
    assert got < min(u["asked"], u["evictable_before"])
    # the eviction receipt of that call carries the same numbers
    r = rec.of(schema.EVICTION)[-1]
    assert (r["asked"], r["evicted"], r["evictable_before"]) == (before, got, before)


# -- stateful property test -------------------------------------------------------------------


class RadixMachine(RuleBasedStateMachine):
    """A harness where everything in use is owned by the tree: requests hand their slots to the
    cache at once and free their unaligned tails, so ``used == cache.total_size()``. Held locks
    are node objects; the lock model is "each held lock adds one to every node on its path"."""

    PAGE = 1
    CAP = 40
    # pages that share leading tokens, so prefixes collide and diverge inside a page
    PAGES = [(0,), (1,), (2,), (3,)]

    def __init__(self) -> None:
        super().__init__()
        self.a = TokenAllocator(self.CAP, self.PAGE)
        self.rec = Receipts(capture=True)
        self.c = RadixCache(self.a, receipts=self.rec)
        self.held: list[TreeNode] = []

    def draw_tokens(self, data: st.DataObject) -> list[int]:
        pages = data.draw(st.lists(st.sampled_from(self.PAGES), max_size=12 // self.PAGE + 1))
        tail = data.draw(st.lists(st.integers(0, 3), max_size=self.PAGE - 1))
        return [t for p in pages for t in p] + tail

    # an oracle that reads the tree as root-to-leaf token strings, not by walking matches
    def oracle(self, tokens: list[int]) -> tuple[int, list[int]]:
        best, best_slots = 0, []
        stack = [(self.c.root, [], [])]
        while stack:
            node, toks, slots = stack.pop()
            toks, slots = toks + node.key, slots + node.value.tolist()
            if not node.children:
                n = 0
                while n < min(len(toks), len(tokens)) and toks[n] == tokens[n]:
                    n += 1
                n = aligned(n, self.PAGE)
                if n > best:
                    best, best_slots = n, slots[:n]
            stack.extend((ch, toks, slots) for ch in node.children.values())
        return best, best_slots

    def alloc_fresh(self, held: int, n: int) -> torch.Tensor | None:
        got = self.a.alloc_extend(held, n, None)
        if got is None:
            short = self.a.pages_needed(held, n) * self.PAGE - self.a.available_size()
            self.c.evict(short, reason="test-oom")
            got = self.a.alloc_extend(held, n, None)
        return got

    @rule(data=st.data())
    def insert_fresh(self, data: st.DataObject) -> None:
        """Fresh slots for all tokens: the cached prefix's slots are duplicates and are freed."""
        tokens = self.draw_tokens(data)
        slots = self.alloc_fresh(0, len(tokens))
        if slots is None:
            return  # memory held by locks or staged: nothing to insert
        have, have_slots = self.oracle(tokens)
        n = aligned(len(tokens), self.PAGE)
        back = self.a.available_size() + self.a.staged_size()
        added = self.c.insert(tokens, slots)
        assert added == n - have
        assert self.a.available_size() + self.a.staged_size() - back == have
        self.a.free(slots[n:])
        m = self.c.match_prefix(tokens)
        assert m.slots.tolist() == have_slots + slots[have:n].tolist()

    @rule(data=st.data(), keep=st.booleans())
    def extend_hit(self, data: st.DataObject, keep: bool) -> None:
        """A request with a cache hit: lock the match, allocate the rest, insert with the same
        prefix slots (nothing freed), then release or keep the lock."""
        tokens = self.draw_tokens(data)
        m = self.c.match_prefix(tokens)
        self.c.inc_lock_ref(m.node)
        new = self.alloc_fresh(m.length, len(tokens) - m.length)
        if new is not None:
            n = aligned(len(tokens), self.PAGE)
            back = self.a.available_size() + self.a.staged_size()
            assert self.c.insert(tokens, torch.cat([m.slots, new])) == n - m.length
            assert self.a.available_size() + self.a.staged_size() == back
            self.a.free(new[n - m.length :])
        if keep and m.node is not self.c.root:
            self.held.append(m.node)
        else:
            self.c.dec_lock_ref(m.node)

    @rule(data=st.data(), lock=st.booleans())
    def match(self, data: st.DataObject, lock: bool) -> None:
        tokens = self.draw_tokens(data)
        want, want_slots = self.oracle(tokens)
        m = self.c.match_prefix(tokens)
        assert m.length == want
        assert m.slots.tolist() == want_slots
        assert path_tokens(m.node) == tokens[:want]
        if lock and m.node is not self.c.root:
            self.c.inc_lock_ref(m.node)
            self.held.append(m.node)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.held) - 1))
        self.c.dec_lock_ref(self.held.pop(i))

    @rule(n=st.integers(0, 48))
    def evict(self, n: int) -> None:
        before = self.c.evictable_size()
        back = self.a.available_size() + self.a.staged_size()
        receipts = len(self.rec.of(schema.EVICTION))
        got = self.c.evict(n)
        assert min(n, before) <= got <= before
        assert self.c.evictable_size() == before - got
        assert self.a.available_size() + self.a.staged_size() - back == got
        assert len(self.rec.of(schema.EVICTION)) == receipts + (n > 0)

    @precondition(lambda self: not self.a.group_open)
    @rule()
    def group_begin(self) -> None:
        self.a.free_group_begin()

    @precondition(lambda self: self.a.group_open)
    @rule()
    def group_flush(self) -> None:
        staged = self.a.staged_size()
        assert self.a.flush_free_group() == staged
        assert self.a.staged_size() == 0

    @precondition(lambda self: self.a.group_open)
    @rule()
    def group_end(self) -> None:
        staged = self.a.staged_size()
        assert self.a.free_group_end() == staged
        assert self.a.staged_size() == 0 and not self.a.group_open

    @invariant()
    def checks_and_ledger(self) -> None:
        self.c.check()
        self.a.check()
        assert self.a.used_size() == self.c.total_size()
        assert self.c.evictable_size() + self.c.protected_size() == self.c.total_size()
        assert self.rec.of(schema.EVICTION_UNDER_DELIVERED) == []

    @invariant()
    def slots_owned_once_and_in_use(self) -> None:
        slots, stack = [], [self.c.root]
        while stack:
            node = stack.pop()
            slots += node.value.tolist()
            stack.extend(node.children.values())
        assert len(slots) == len(set(slots)) == self.c.total_size()
        pages = torch.tensor(slots, dtype=torch.int64) // self.PAGE
        assert bool((self.a._state[pages] == IN_USE).all()), "the tree holds a freed slot"

    @invariant()
    def locks_match_the_held_list(self) -> None:
        expected: dict[int, int] = {}
        for node in self.held:
            # still attached: every step up is a live edge, ending at the root
            while node is not self.c.root:
                parent = node.parent
                assert parent is not None, "a locked node (or its ancestor) was evicted"
                assert parent.children.get(tuple(node.key[: self.PAGE])) is node
                expected[id(node)] = expected.get(id(node), 0) + 1
                node = parent
        stack = [self.c.root]
        while stack:
            node = stack.pop()
            for ch in node.children.values():
                assert ch.lock_ref == expected.get(id(ch), 0)
                if node is not self.c.root:
                    assert ch.lock_ref <= node.lock_ref
                stack.append(ch)

    @invariant()
    def evicting_the_counter_pays_exactly(self) -> None:
        """On a deep copy: evict(evictable_size()) frees exactly that and leaves only locked
        nodes. The original is untouched."""
        shadow = Receipts(capture=True)
        a2, c2 = copy.deepcopy((self.a, self.c), {id(self.rec): shadow})
        assert c2.allocator is a2 and c2.receipts is shadow and c2.root is not self.c.root
        assert c2.shape() == self.c.shape()
        assert a2.used_size() == self.a.used_size()
        total = self.c.total_size()
        k = c2.evictable_size()
        assert c2.evict(k) == k
        assert c2.evictable_size() == 0 and c2.total_size() == c2.protected_size()
        s = c2.shape()
        assert s.nodes == s.locked_nodes
        assert a2.used_size() == c2.total_size()
        c2.check()
        a2.check()
        assert shadow.of(schema.EVICTION_UNDER_DELIVERED) == []
        assert self.c.total_size() == total and self.c.evictable_size() == k


class RadixMachinePage4(RadixMachine):
    PAGE = 4
    CAP = 64
    PAGES = [(0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 1), (1, 1, 1, 1)]


_machine_settings = settings(max_examples=50, stateful_step_count=40, deadline=None)
TestRadixMachinePage1 = RadixMachine.TestCase
TestRadixMachinePage1.settings = _machine_settings
TestRadixMachinePage4 = RadixMachinePage4.TestCase
TestRadixMachinePage4.settings = _machine_settings


# -- shape() ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ps", [1, 4])
def test_shape_counts_a_complete_tree_exactly(ps):
    """A complete 3-ary tree of depth 7 (3279 nodes, 2187 leaves), built by inserting every
    root-to-leaf path; siblings differ in their first token so every level is a node."""
    k, depth, seg = 3, 7, 2 * ps
    nodes_total = sum(k**level for level in range(1, depth + 1))
    a, c, _ = make(nodes_total * seg + depth * seg, ps)

    def path(choices: tuple[int, ...]) -> list[int]:
        return [t for lvl, ch in enumerate(choices) for t in [ch] + [10 + lvl] * (seg - 1)]

    def all_paths(prefix=()):
        if len(prefix) == depth:
            yield prefix
            return
        for ch in range(k):
            yield from all_paths(prefix + (ch,))

    leaves = list(all_paths())
    for i, choices in enumerate(leaves):  # both ways a request hands its slots to the cache
        (put if i % 2 else put_hit)(a, c, path(choices))
    # lock the leaves of some paths (one of them twice): their prefixes are the locked nodes
    chosen = leaves[::97] + [leaves[0]]
    for choices in chosen:
        c.inc_lock_ref(node_of(c, path(choices)))
    locked = {choices[:lvl] for choices in chosen for lvl in range(1, depth + 1)}

    s = c.shape()
    assert s.problems == []
    assert s.nodes == nodes_total == 3279
    assert s.leaves == k**depth == 2187
    assert s.depth == depth
    assert s.tokens == nodes_total * seg == c.total_size()
    assert s.locked_nodes == len(locked)
    assert s.locked_tokens == len(locked) * seg == c.protected_size()
    c.check()

    c.evict(c.evictable_size())  # only the locked paths remain
    s = c.shape()
    assert (s.nodes, s.locked_nodes, s.leaves) == (len(locked), len(locked), len(set(chosen)))
    assert s.tokens == len(locked) * seg


def _expected_shape(seqs: list[list[int]], ends: list[list[int]], locks: list[list[int]], ps):
    """Independent of the cache: a trie of pages. A radix node ends at every trie node where an
    inserted or matched prefix ends or the trie branches; each radix node is the run of trie
    nodes down to such a point. Returns (nodes, tokens, locked_nodes, locked_tokens, leaves,
    depth)."""
    trie: dict = {}
    marked: set[int] = set()  # id() of trie nodes that end a radix node
    for seq in seqs + ends:
        n = aligned(len(seq), ps)
        node = trie
        for i in range(0, n, ps):
            node = node.setdefault(tuple(seq[i : i + ps]), {})
        if n:
            marked.add(id(node))
    locked_ids: set[int] = set()
    for seq in locks:
        node, on_path = trie, []
        for i in range(0, aligned(len(seq), ps), ps):
            node = node[tuple(seq[i : i + ps])]
            on_path.append(node)
        locked_ids.update(id(x) for x in on_path)
    nodes = tokens = locked_nodes = locked_tokens = leaves = depth = 0
    # (trie node, radix depth of the nearest marked ancestor, pages since it)
    stack = [(child, 0, 1) for child in trie.values()]
    while stack:
        node, rdepth, run = stack.pop()
        tokens += ps
        end = id(node) in marked or len(node) != 1
        if end:
            nodes += 1
            rdepth += 1
            depth = max(depth, rdepth)
            if id(node) in locked_ids:
                locked_nodes += 1
                locked_tokens += run * ps
            if not node:
                leaves += 1
        stack.extend((child, rdepth, 1 if end else run + 1) for child in node.values())
    return nodes, tokens, locked_nodes, locked_tokens, leaves, depth


@pytest.mark.parametrize("ps", [1, 4])
def test_shape_matches_an_independent_count_of_thousands_of_random_sequences(ps):
    rng = random.Random(20240611 + ps)
    seqs: list[list[int]] = []
    for _ in range(3000):
        length = rng.randint(8, 64)
        if seqs and rng.random() < 0.8:  # share a random prefix with an earlier sequence
            prev = rng.choice(seqs)
            head = prev[: rng.randint(0, min(len(prev), length))]
        else:
            head = []
        seqs.append(head + [rng.randrange(50) for _ in range(length - len(head))])
    a, c, _ = make(sum(map(len, seqs)) + 64, ps)
    for i, seq in enumerate(seqs):
        (put if i % 4 == 0 else put_hit)(a, c, seq)
    # matches that end inside nodes split them; some of them are locked
    ends, locks = [], []
    for i in range(300):
        seq = rng.choice(seqs)
        prefix = seq[: rng.randint(ps, len(seq))]
        m = c.match_prefix(prefix)
        assert m.length == aligned(len(prefix), ps)
        ends.append(prefix)
        if i % 3 == 0:
            c.inc_lock_ref(m.node)
            locks.append(prefix)

    nodes, tokens, locked_nodes, locked_tokens, leaves, depth = _expected_shape(
        seqs, ends, locks, ps
    )
    assert nodes > 2000 and depth >= 5  # the construction is as big and deep as intended
    s = c.shape()
    assert s.problems == []
    assert (s.nodes, s.tokens, s.locked_nodes, s.locked_tokens, s.leaves, s.depth) == (
        nodes,
        tokens,
        locked_nodes,
        locked_tokens,
        leaves,
        depth,
    )
    assert s.tokens == c.total_size() and s.locked_tokens == c.protected_size()
    c.check()


def test_shape_walks_a_5000_deep_chain_without_recursion():
    depth = 5000
    assert depth > sys.getrecursionlimit()  # a recursive walk could not get there
    a, c, _ = make(depth, 1)
    seq = list(range(depth))
    put(a, c, seq)
    # cut the single node from the bottom up: each match splits one token off, giving a chain
    # whose every node extends its parent by one page
    for n in range(depth - 1, 0, -1):
        assert c.match_prefix(seq[:n]).length == n
    c.inc_lock_ref(node_of(c, seq))
    s = c.shape()
    assert s.problems == []
    assert (s.nodes, s.tokens, s.leaves, s.depth) == (depth, depth, 1, depth)
    assert s.locked_nodes == s.locked_tokens == depth
    c.check()


def _small_tree() -> tuple[RadixCache, dict[str, TreeNode]]:
    a, c, _ = make(64, 1)
    for toks in ([1, 1], [1, 1, 2, 2], [3, 3, 3]):
        put(a, c, toks)
    nodes = {
        "A": node_of(c, [1, 1]),
        "B": node_of(c, [1, 1, 2, 2]),
        "C": node_of(c, [3, 3, 3]),
    }
    s = c.shape()
    assert (s.nodes, s.tokens, s.leaves, s.depth, s.problems) == (3, 7, 2, 2, [])
    return c, nodes


def test_shape_reports_a_child_that_does_not_point_back():
    c, n = _small_tree()
    n["B"].parent = n["C"]
    s = c.shape()
    assert (s.nodes, s.tokens, s.leaves, s.depth) == (3, 7, 2, 2)
    assert s.problems == [f"node {n['B'].id} does not point back to its parent {n['A'].id}"]


class _Unreadable:
    def __len__(self) -> int:
        raise RuntimeError("key memory is gone")


def test_shape_reports_a_node_whose_key_cannot_be_read():
    c, n = _small_tree()
    n["C"].key = _Unreadable()
    s = c.shape()  # does not raise
    assert len(s.problems) == 1
    assert f"node {n['C'].id}" in s.problems[0] and "RuntimeError" in s.problems[0]
    assert s.tokens == 4  # A and B are still counted
    assert s.depth == 2
    with pytest.raises(RuntimeError):
        c.check()  # check() is allowed to raise; shape() is not


def test_shape_reports_a_cycle_and_terminates():
    c, n = _small_tree()
    n["B"].children[(1,)] = n["A"]  # A is now its own grandchild
    s = c.shape()
    assert any(f"node {n['A'].id} reached twice" in p for p in s.problems)
    assert s.nodes == 3 and s.tokens == 7


def test_shape_reports_a_node_whose_children_are_unreadable():
    c, n = _small_tree()
    n["A"].children = None
    s = c.shape()
    assert len(s.problems) == 1 and f"node {n['A'].id}" in s.problems[0]
    assert s.tokens == 3  # C alone; A's subtree could not be read


def test_shape_of_an_empty_cache():
    _, c, _ = make(8, 1)
    s = c.shape()
    assert (s.nodes, s.tokens, s.locked_nodes, s.locked_tokens, s.leaves, s.depth) == (0,) * 6
    assert s.problems == []


def test_the_lru_heap_stays_bounded_while_nothing_evicts():
    # a request blocked at the head of the queue is matched, locked and unlocked every step;
    # each round leaves a stale heap entry, which must not pile up without an eviction
    a = TokenAllocator(256, 1)
    c = RadixCache(a)
    toks = list(range(16))
    c.insert(toks, a.alloc_extend(0, 16, None))
    for _ in range(1000):
        m = c.match_prefix(toks)
        c.inc_lock_ref(m.node)
        c.dec_lock_ref(m.node)
    assert len(c._heap) <= 4 * (c.total_size() + 1) + 64  # the heap's own compaction bound
    c.check()
