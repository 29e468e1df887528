"""A stateful property test of the tiered cache: whatever sequence of computes, hits (with
loads), releases and evictions runs, both ledgers balance, the counters agree with the tree, the
evictable counter pays exactly, and the KV follows its tokens wherever it lives."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.memory.pages import whole_pages
from engine.memory.radix import TreeNode
from tests.unit.test_host_tier import Tiered

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=24)


class TieredCacheMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]), host=st.sampled_from([8, 24, 48]))
    def start(self, page_size: int, host: int) -> None:
        self.t = Tiered(device=64, host=host, page_size=page_size)
        self.held: list[TreeNode] = []

    @rule(seq=TOKENS)
    def compute(self, seq: list[int]) -> None:
        """A request finishes: its KV is computed into fresh slots and cached (the scheduler
        evicts first when the pool is short, and skips what it cannot fund)."""
        t = self.t
        short = whole_pages(len(seq), t.ps) - t.a.available_size()
        if short > t.c.evictable_size():
            return
        if short > 0:
            assert t.c.evict(short, reason="test") >= short
        t.compute(seq)

    @rule(seq=TOKENS, limit=st.integers(0, 40))
    def hit(self, seq: list[int], limit: int) -> None:
        """A request is admitted with a prefix hit: it loads what its budget funds and holds it."""
        if len(self.held) < 3:
            _, node = self.t.hit(seq, limit)  # checks the KV of the whole device prefix
            self.held.append(node)

    @rule(i=st.integers(0, 2))
    def release(self, i: int) -> None:
        if self.held:
            self.t.c.dec_lock_ref(self.held.pop(i % len(self.held)))

    @rule(n=st.integers(0, 64), backed=st.booleans())
    def evict(self, n: int, backed: bool) -> None:
        c = self.t.c
        before = c.evictable_size()
        got = c.evict(n, reason="test", host_backed_only=backed)
        if not backed:
            assert got >= min(n, before)  # law 1, with a tier attached
        assert c.evictable_size() == before - got

    @invariant()
    def books_balance(self) -> None:
        if hasattr(self, "t"):
            self.t.check()
            assert self.t.rec.of("eviction.under_delivered") == []


TieredCacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40)
test_tiered_cache = TieredCacheMachine.TestCase
