"""The durable KV store against a model of it (a hypothesis state machine): pinned pages are never
evicted, pin counts are exact under branching and unpinning, the ledger in allocated bytes equals
``os.stat`` summed over the files on disk, ``reclaimable`` is exactly what eviction frees, the cap
holds, and a restart (a fresh store scanning the same directory) changes none of it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.observability.receipts import Receipts
from engine.tiers.kv_store import PageIn, PageStore, Refused
from engine.tiers.store_files import page_key

ID = "model-a"
CAP = 96 * 1024
PIN_BUDGET = 48 * 1024


def disk_bytes(root: Path) -> int:
    """Allocated bytes of every file under ``root``, measured here (never less than a file's
    size); the test asserts the filesystem charges small files more than their size."""
    total = apparent = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            st = os.stat(Path(dirpath) / name)
            total += max(st.st_blocks * 512, st.st_size)
            apparent += st.st_size
    return total


def test_this_filesystem_charges_a_small_file_more_than_its_size(tmp_path: Path) -> None:
    """The state machine's ledger check tells allocated from apparent bytes only where they
    differ: they do for small files here."""
    (tmp_path / "f").write_bytes(b"x" * 100)
    st = os.stat(tmp_path / "f")
    assert st.st_blocks * 512 > st.st_size


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="kvstore-"))
        self.rec = Receipts(capture=True)
        self.store = self._open()
        self.chains: list[list[str]] = []  # prompts written: their page keys in order
        self.payloads: dict[str, bytes] = {}
        self.cps: dict[str, tuple[str, ...]] = {}  # the model: checkpoint -> keys it pins
        self.n = 0

    def _open(self) -> PageStore:
        store = PageStore(self.dir, CAP, ID, self.rec, pin_budget=PIN_BUDGET)
        store.scan()
        return store

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(
        base=st.integers(0, 3),
        pages=st.lists(st.integers(0, 9000), min_size=1, max_size=4),
        extend=st.booleans(),
    )
    def write(self, base: int, pages: list[int], extend: bool) -> None:
        """A prompt's pages, a new one or one extending (branching from) a written prompt."""
        keys: list[str] = []
        if extend and self.chains:
            keys = list(self.chains[base % len(self.chains)][: len(pages)])
        parent = keys[-1] if keys else None
        batch = []
        for size in pages:
            self.n += 1
            tokens = [self.n, self.n + 1]
            key = page_key(parent, tokens, ID)
            payload = bytes([self.n % 251]) * size
            self.payloads[key] = payload
            batch.append(PageIn(key, parent, tokens, payload))
            keys.append(key)
            parent = key
        self.store.write(batch, reason="test")
        self.chains.append(keys)

    @rule(which=st.integers(0, 50))
    def read(self, which: int) -> None:
        if not self.chains:
            return
        keys = self.chains[which % len(self.chains)]
        got = self.store.read(keys)
        for key, payload in zip(keys, got, strict=False):
            assert payload == self.payloads[key]

    @rule(which=st.integers(0, 50), upto=st.integers(1, 8))
    def checkpoint(self, which: int, upto: int) -> None:
        """Pin a prefix of a written prompt (those of its pages still in the store)."""
        if not self.chains:
            return
        chain = self.chains[which % len(self.chains)]
        keys = []
        for key in chain[:upto]:
            if not self.store.has(key):
                break
            keys.append(key)
        if not keys:
            return
        before = (self.store.capacity(), sorted(self.store.checkpoints), disk_bytes(self.dir))
        want, _ = self.store.pin_numbers(keys)
        cid = f"cp{self.n}-{which}"
        self.n += 1
        got = self.store.create_checkpoint(cid, keys, 2 * len(keys))
        if isinstance(got, Refused):
            assert got.overshoot > 0 and got.want > want and got.budget == PIN_BUDGET
            assert got.held + got.want - got.budget == got.overshoot
            after = (self.store.capacity(), sorted(self.store.checkpoints), disk_bytes(self.dir))
            assert after == before  # refused: nothing changed
        else:
            assert got.pinned_bytes == want  # a branch sharing all its pages pins none anew
            self.cps[cid] = tuple(keys)

    @precondition(lambda self: self.cps)
    @rule(which=st.integers(0, 50))
    def unpin(self, which: int) -> None:
        cid = sorted(self.cps)[which % len(self.cps)]
        assert self.store.delete_checkpoint(cid) is not None
        del self.cps[cid]

    @rule(need=st.integers(0, 2 * CAP))
    def evict(self, need: int) -> None:
        reclaimable = self.store.reclaimable
        freed = self.store.evict(need, reason="test")
        assert freed <= reclaimable
        assert freed >= min(need, reclaimable)  # it pays what it promised

    @rule()
    def evict_everything(self) -> None:
        reclaimable = self.store.reclaimable
        assert self.store.evict(10 * CAP, reason="test") == reclaimable
        assert self.store.reclaimable == 0

    @rule()
    def restart(self) -> None:
        numbers = self.store.capacity()
        pins = {k: e.pins for k, e in self.store.entries.items()}
        self.store = self._open()
        assert self.store.capacity() == numbers
        assert {k: e.pins for k, e in self.store.entries.items()} == pins

    @invariant()
    def ledger_is_the_disk(self) -> None:
        store = self.store
        assert store.used == disk_bytes(self.dir)
        assert store.used <= CAP
        assert store.pinned + store.reclaimable == store.used
        assert store.pinned <= PIN_BUDGET

    @invariant()
    def pins_are_exact_and_pinned_pages_stay(self) -> None:
        want: dict[str, int] = {}
        for keys in self.cps.values():
            for key in set(keys):
                want[key] = want.get(key, 0) + 1
        got = {k: e.pins for k, e in self.store.entries.items() if e.pins}
        assert got == want
        assert set(self.store.checkpoints) == set(self.cps)
        for key in want:
            assert self.store.read([key]) == [self.payloads[key]]


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
