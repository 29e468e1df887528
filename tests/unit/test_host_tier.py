"""The host KV tier under the radix cache: a spill keeps the KV bit for bit and frees the device
pages, a load brings it back into fresh ones, both ledgers balance, the evictable counter counts
device tokens payable now, and the host makes room least recently used first."""

from __future__ import annotations

import pytest
import torch

from engine.memory.allocator import TokenAllocator
from engine.memory.kv_pool import KVPool
from engine.memory.radix import RadixCache, TreeNode
from engine.observability.receipts import Receipts
from engine.scheduler.ledger import ledger_violations, read_host_ledger
from engine.tiers.host_tier import HostTier

LAYERS = 2


def kv_value(prefix: list[int]) -> float:
    """What the model would compute at the last token of ``prefix`` (a function of the prefix)."""
    return float(sum((i + 1) * t for i, t in enumerate(prefix)) % 9973)


class Tiered:
    """A device pool, a radix cache over it and a host tier: the memory layer without a model."""

    def __init__(self, device: int, host: int, page_size: int = 1) -> None:
        self.a = TokenAllocator(device, page_size)
        self.rec = Receipts(capture=True)
        self.kv = KVPool(LAYERS, self.a.pool_slots, 1, 2, torch.float32)
        self.c = RadixCache(
            self.a, receipts=self.rec, tier=lambda c: HostTier(c, self.kv, host, self.rec)
        )
        self.tier = self.c.tier
        self.ps = page_size

    def compute(self, tokens: list[int]) -> None:
        """What a finished request leaves behind: its KV written into fresh slots, the aligned
        part handed to the cache, the partial last page freed."""
        slots = self.a.alloc_extend(0, len(tokens), None)
        assert slots is not None, "test set-up: device pool too small"
        self.write(tokens, 0, slots)
        self.c.insert(tokens, slots)
        aligned = len(tokens) - len(tokens) % self.ps
        if aligned < len(tokens):
            self.a.free(slots[aligned:])

    def write(self, tokens: list[int], start: int, slots: torch.Tensor) -> None:
        for i, s in enumerate(slots.tolist()):
            value = kv_value(tokens[: start + i + 1])
            for layer in self.kv.layers:
                layer.k[s] = value
                layer.v[s] = -value

    def hit(self, tokens: list[int], limit: int = 10**9) -> tuple[int, TreeNode]:
        """What admission does on a hit: match, lock, load the host part; returns (device prefix
        length, the locked node)."""
        m = self.c.match_prefix(tokens)
        self.c.inc_lock_ref(m.node)
        if m.host_len:
            m = self.tier.load(m, limit, "r-test")
        self.assert_kv(tokens, m.slots, self.kv)
        return m.length, m.node

    def assert_kv(
        self, tokens: list[int], slots: torch.Tensor, pool: KVPool, start: int = 0
    ) -> None:
        """``slots`` hold the KV of ``tokens`` from position ``start`` on."""
        n = int(slots.numel())
        want = torch.tensor([kv_value(tokens[: i + 1]) for i in range(start, start + n)])
        for layer in pool.layers:
            assert torch.equal(layer.k[slots, 0, 0], want)
            assert torch.equal(layer.v[slots, 0, 1], -want)

    def check(self) -> None:
        """Both ledgers balance (no request holds private slots here) and the books agree."""
        assert ledger_violations(self.a, self.c, private=0) == []
        host = read_host_ledger(self.tier)
        assert host.free + host.used == host.capacity
        for node, tokens in self.walk():  # the KV follows its tokens wherever it lives
            start = len(tokens) - len(node.key)
            if node.value is not None:
                self.assert_kv(tokens, node.value, self.kv, start)
            if node.host is not None:
                self.assert_kv(tokens, node.host, self.tier.kv, start)

    def walk(self):
        """(node, the tokens from the root through the node) for every node."""
        stack = [(self.c.root, [])]
        while stack:
            node, path = stack.pop()
            for child in node.children.values():
                tokens = path + child.key
                yield child, tokens
                stack.append((child, tokens))


# -- spill and load ---------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_spill_keeps_the_kv_and_a_hit_loads_it_back_bit_for_bit(page_size):
    t = Tiered(device=64, host=64, page_size=page_size)
    seq = list(range(2, 26))  # 24 tokens
    t.compute(seq)
    assert t.c.evictable_size() == 24
    assert t.c.evict(24, reason="test") == 24  # spilled, not dropped
    assert t.c.total_size() == 0 and t.c.evictable_size() == 0  # nothing left on the device
    assert t.a.available_size() == 64  # its device pages are free
    assert t.tier.used_size() == 24
    (spill,) = t.rec.of("tier.spill")
    assert spill["tokens"] == 24 and spill["bytes"] == 24 * t.kv.bytes_per_token
    assert spill["dropped"] == 0 and spill["seconds"] >= 0
    t.check()
    m = t.c.match_prefix(seq + [99])
    assert m.length == 0 and m.host_len == 24  # a hit, all of it on the host
    n, node = t.hit(seq + [99])  # the hit checks the loaded KV against what was computed
    assert n == 24 and node.value is not None and node.host is not None  # on both now
    (load,) = t.rec.of("tier.load")
    assert load["tokens"] == 24 and load["rid"] == "r-test" and load["asked"] == 24
    assert t.c.protected_size() == 24 and t.c.evictable_size() == 0  # the hit holds it
    t.check()


def test_evictable_counts_device_tokens_payable_now_and_eviction_pays_them_exactly():
    t = Tiered(device=48, host=64)
    t.compute([1] * 16)
    t.compute([2] * 16)
    t.c.evict(16)  # the older one goes to the host
    assert t.c.evictable_size() == 16  # host-only tokens are not payable on the device
    before = t.c.evictable_size()
    assert t.c.evict(before) == before  # law 1: the counter pays exactly, with a tier too
    assert t.c.evictable_size() == 0 and t.a.available_size() == 48
    assert t.rec.of("eviction.under_delivered") == []
    t.check()


def test_insert_over_host_only_nodes_makes_the_new_slots_their_device_copy():
    """A request that prefilled instead of loading hands its slots back over the host-only
    nodes: they become device copies (no duplicate, nothing freed twice)."""
    t = Tiered(device=64, host=64)
    seq = list(range(3, 19))
    t.compute(seq)
    t.c.evict(16)
    t.compute(seq + [7, 8])  # computed again from scratch, then cached
    m = t.c.match_prefix(seq + [7, 8, 9])
    assert m.length == 18 and m.host_len == 0
    node = m.node.parent
    assert node.value is not None and node.host is not None  # the shared part lives on both
    assert t.c.total_size() == 18
    t.check()


# -- the host makes room ----------------------------------------------------------------------


def test_a_full_host_drops_its_least_recently_used_copies_first():
    t = Tiered(device=32, host=32)
    for k in (1, 2, 3):
        t.compute([k] * 16)
        t.c.evict(16)  # each spills; the third needs the room of the first
    drops = t.rec.of("tier.drop")
    assert [d["tokens"] for d in drops] == [16] and drops[0]["reason"] == "spill"
    assert t.c.match_prefix([1] * 16).host_len == 0  # the oldest is gone for good
    assert t.c.match_prefix([2] * 16).host_len == 16
    assert t.c.match_prefix([3] * 16).host_len == 16
    t.check()


def test_a_node_the_host_cannot_hold_is_dropped_with_its_device_pages_freed():
    t = Tiered(device=64, host=8)
    t.compute(list(range(2, 18)))  # 16 tokens, one node: more than the whole host tier
    assert t.c.evict(16) == 16
    (spill,) = t.rec.of("tier.spill")
    assert spill["tokens"] == 0 and spill["dropped"] == 16
    assert t.a.available_size() == 64 and t.c.shape().nodes == 0
    t.check()


def test_a_hit_being_loaded_is_never_dropped_to_make_room_for_its_own_funding():
    """Loading needs device pages; evicting for them spills other nodes, whose room on the host
    must not come from the path being loaded (it is locked while it loads)."""
    t = Tiered(device=32, host=16)
    t.compute([5] * 16)
    t.c.evict(16)  # [5]*16 fills the host
    t.compute([6] * 16)
    t.compute([7] * 16)  # the device is full of cached nodes
    n, _ = t.hit([5] * 16 + [1])  # funds its pages by evicting [6]; the host keeps [5]
    assert n == 16
    assert t.rec.of("tier.spill")[-1]["dropped"] == 16  # [6] had no room: dropped instead
    assert t.c.match_prefix([6] * 16).host_len == 0
    t.check()


# -- loads: partial, and the lock ---------------------------------------------------------


def test_a_load_limited_by_the_budget_splits_on_a_page_and_moves_the_lock():
    t = Tiered(device=64, host=64, page_size=4)
    seq = list(range(2, 26))
    t.compute(seq)
    t.c.evict(24)
    n, node = t.hit(seq + [1], limit=10)  # the budget funds 10 tokens: two whole pages
    assert n == 8 and len(node.key) == 8 and node.lock_ref == 1
    rest = node.children[tuple(seq[8:12])]
    assert rest.value is None and rest.host is not None and rest.lock_ref == 0
    assert t.c.protected_size() == 8
    t.c.dec_lock_ref(node)
    assert t.c.evictable_size() == 8
    t.check()


def test_a_load_with_no_room_and_nothing_to_evict_leaves_the_hit_on_the_host():
    t = Tiered(device=16, host=32)
    t.compute([4] * 16)
    t.c.evict(16)
    held = t.a.alloc(16)  # a running request holds the whole device pool
    m = t.c.match_prefix([4] * 16 + [1])
    got = t.tier.load(m, 16, "r-x")
    assert got is m and t.rec.of("tier.load") == []
    assert t.c.match_prefix([4] * 16).host_len == 16
    t.a.free(held)
    t.check()


# -- shedding host-backed copies ------------------------------------------------------------


def test_host_backed_eviction_sheds_without_copying_and_keeps_its_own_promise():
    t = Tiered(device=48, host=64)
    t.compute([1] * 16)
    t.c.evict(16)
    _, node = t.hit([1] * 16 + [2])  # on both now
    t.c.dec_lock_ref(node)
    t.compute([3] * 16)  # device-only
    spills = len(t.rec.of("tier.spill"))
    assert t.c.evict(32, host_backed_only=True) == 16  # only the host-backed one goes
    assert len(t.rec.of("tier.spill")) == spills  # no copy was made
    ev = t.rec.of("eviction")[-1]
    assert ev["scope"] == "host_backed" and ev["evictable_before"] == 16
    assert ev["evicted"] == 16 and ev["evictable_after"] == 0
    assert t.rec.of("eviction.under_delivered") == []
    assert t.c.match_prefix([3] * 16).length == 16  # the device-only node stayed
    t.check()


# -- the books ----------------------------------------------------------------------------


def test_check_names_a_host_copy_the_tier_forgot_to_free():
    t = Tiered(device=32, host=32)
    t.compute([9] * 16)
    t.c.evict(16)
    (node,) = list(t.tier.nodes)
    t.tier.nodes.discard(node)  # the tier forgets a node the tree still holds
    kinds = [k for k, _ in ledger_violations(t.a, t.c, private=0)]
    assert kinds == ["host_ledger", "host_tier"]


def test_reset_to_empty_empties_both_tiers():
    t = Tiered(device=32, host=32)
    t.compute([1] * 16)
    t.c.evict(16)
    t.compute([2] * 16)
    t.c.reset_to_empty()
    assert t.c.shape().nodes == 0 and t.tier.used_size() == 0
    assert t.a.available_size() == 32 and t.tier.alloc.available_size() == 32
    assert t.rec.of("tier.drop")[-1]["reason"] == "reset"
    t.check()


# -- a copy that fails ------------------------------------------------------------------------


def broken_copy(*args):
    raise RuntimeError("copy engine gone")


def test_a_spill_whose_copy_fails_drops_instead_and_eviction_still_pays(monkeypatch):
    import engine.tiers.host_tier as host_tier

    t = Tiered(device=32, host=32)
    t.compute([1] * 16)
    monkeypatch.setattr(host_tier, "copy_kv", broken_copy)
    assert t.c.evict(16) == 16  # law 1: the counter's promise is kept
    (spill,) = t.rec.of("tier.spill")
    assert spill["tokens"] == 0 and spill["dropped"] == 16
    assert spill["error"] == "RuntimeError: copy engine gone"
    assert t.c.shape().nodes == 0 and t.a.available_size() == 32 and t.tier.used_size() == 0
    t.check()


def test_a_load_whose_copy_fails_leaves_the_hit_on_the_host(monkeypatch):
    import engine.tiers.host_tier as host_tier

    t = Tiered(device=32, host=32)
    t.compute([1] * 16)
    t.c.evict(16)
    monkeypatch.setattr(host_tier, "copy_kv", broken_copy)
    m = t.c.match_prefix([1] * 16 + [2])
    assert t.tier.load(m, 16, "r-1") is m
    (load,) = t.rec.of("tier.load")
    assert load["tokens"] == 0 and load["error"] == "RuntimeError: copy engine gone"
    assert t.a.available_size() == 32 and t.c.match_prefix([1] * 16).host_len == 16
    assert all(n.lock_ref == 0 for n, _ in t.walk())
    t.check()


def test_host_copies_that_go_with_a_spill_that_failed_are_dropped_with_a_receipt(monkeypatch):
    """A node whose spill fails is taken out with what hangs below it; a host copy among those
    (spilled earlier) is forgotten too, and that is a tier.drop like any other."""
    import engine.tiers.host_tier as host_tier

    t = Tiered(device=64, host=64)
    t.compute([1] * 16)
    t.compute([1] * 16 + [2] * 16)  # a child below the first node
    assert t.c.evict(16) == 16  # the child (least recently used leaf) spills to the host
    assert t.tier.used_size() == 16
    monkeypatch.setattr(host_tier, "copy_kv", broken_copy)
    assert t.c.evict(16) == 16  # the parent's spill fails: it drops, its host-only child too
    assert t.tier.used_size() == 0
    (drop,) = t.rec.of("tier.drop")
    assert (drop["reason"], drop["tokens"], drop["nodes"]) == ("spill_failed", 16, 1)
    t.check()
