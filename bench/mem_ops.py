"""Memory-manager operation rates: TokenAllocator alloc+free, RadixCache match_prefix and evict,
at a 10k-token and a 1M-token cache. Each figure is the median of 3 runs, in this process, on
the CPU. The point of the eviction rows: evict's cost follows what it frees, not the tree size.

    .venv/bin/python bench/mem_ops.py [--runs 3] [--seed 0]

Caches are built by inserting 256-token sequences: groups of sequences share a 192-token prefix
and end in 64 tokens of their own, so the leaves are 64-token nodes under shared prefix nodes
(page_size 1). Every eviction run works on a fresh deep copy of the full cache.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time

import torch

from engine.memory.allocator import TokenAllocator
from engine.memory.radix import RadixCache
from engine.observability.receipts import Receipts

SIZES = {"10k": 10_000, "1M": 1_000_000}
PREFIX, SUFFIX = 192, 64  # a 256-token sequence: a shared prefix and its own tail
PER_GROUP = 16  # sequences sharing one prefix


def median_rate(runs: int, ops: int, one_run) -> float:
    """ops/second, median over ``runs`` calls of ``one_run`` (which returns its seconds)."""
    return statistics.median(ops / one_run() for _ in range(runs))


def bench_alloc_free(capacity: int, page_size: int, runs: int, pairs: int = 5000) -> float:
    a = TokenAllocator(capacity, page_size)
    held = a.alloc(capacity // 2 // page_size * page_size)  # a half-full pool, not a fresh one
    assert held is not None

    def one_run() -> float:
        t = time.perf_counter()
        for _ in range(pairs):
            a.free(a.alloc(16))
        return time.perf_counter() - t

    rate = median_rate(runs, pairs, one_run)
    a.check()
    return rate


class Built:
    def __init__(self, tokens: int, rng: random.Random) -> None:
        n_seq = tokens // (SUFFIX + PREFIX // PER_GROUP)
        n_groups = max(1, n_seq // PER_GROUP)
        self.prefixes = [[rng.randrange(32000) for _ in range(PREFIX)] for _ in range(n_groups)]
        self.allocator = TokenAllocator(tokens + 4 * (PREFIX + SUFFIX), 1)
        self.receipts = Receipts()  # no sink: emitting costs what the engine pays without a log
        self.cache = RadixCache(self.allocator, receipts=self.receipts)
        for i in range(n_seq):  # round-robin over the groups: LRU order mixes them
            seq = self.prefixes[i % n_groups] + [rng.randrange(32000) for _ in range(SUFFIX)]
            m = self.cache.match_prefix(seq)  # what a request with a cache hit does
            new = self.allocator.alloc(len(seq) - m.length)
            self.cache.insert(seq, torch.cat([m.slots, new]))
        self.cache.check()
        self.allocator.check()

    def fresh(self) -> tuple[TokenAllocator, RadixCache]:
        memo = {id(self.receipts): self.receipts}
        return copy.deepcopy((self.allocator, self.cache), memo)


def bench_match(b: Built, rng: random.Random, runs: int, calls: int = 5000) -> float:
    prompts = [
        rng.choice(b.prefixes) + [rng.randrange(32000) for _ in range(SUFFIX)] for _ in range(64)
    ]
    for p in prompts:
        assert b.cache.match_prefix(p).length == PREFIX  # hits the cached prefix, not more

    def one_run() -> float:
        t = time.perf_counter()
        for i in range(calls):
            b.cache.match_prefix(prompts[i % 64])
        return time.perf_counter() - t

    return median_rate(runs, calls, one_run)


def bench_evict(b: Built, n: int, calls: int, runs: int) -> tuple[float, float]:
    """(evict(n) calls/second, tokens freed per call), each run on a fresh copy of the cache."""
    freed: list[int] = []

    def one_run() -> float:
        _, c = b.fresh()
        t = time.perf_counter()
        got = [c.evict(n) for _ in range(calls)]
        dt = time.perf_counter() - t
        freed.extend(got)
        c.check()
        return dt

    return median_rate(runs, calls, one_run), statistics.mean(freed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    torch.set_num_threads(1)
    t_start = time.perf_counter()

    rows: list[tuple[str, dict[str, float]]] = []
    for ps in (1, 16):
        rows.append(
            (
                f"alloc(16)+free, page_size {ps}",
                {k: bench_alloc_free(v, ps, args.runs) for k, v in SIZES.items()},
            )
        )

    built, match, ev64, ev6400, freed = {}, {}, {}, {}, {}
    for name, tokens in SIZES.items():
        t = time.perf_counter()
        built[name] = b = Built(tokens, rng)
        s = b.cache.shape()
        print(
            f"built {name} cache: {s.tokens} tokens in {s.nodes} nodes "
            f"({s.leaves} leaves of {SUFFIX}), {time.perf_counter() - t:.1f}s"
        )
        match[name] = bench_match(b, rng, args.runs)
        ev64[name], freed[name, 64] = bench_evict(b, 64, calls=50, runs=args.runs)
        ev6400[name], freed[name, 6400] = bench_evict(b, 6400, calls=1, runs=args.runs)
    rows.append(("match_prefix, 256-token prompt, 192 hit", match))
    rows.append(("evict(64): one 64-token leaf", ev64))
    rows.append(("evict(6400): 100 leaves", ev6400))

    print()
    print(f"{'operation (ops/second, median of ' + str(args.runs) + ')':<44}", end="")
    print("".join(f"{k:>14}" for k in SIZES))
    for label, by_size in rows:
        print(f"{label:<44}" + "".join(f"{by_size[k]:>14,.0f}" for k in SIZES))
    print()
    for name in SIZES:
        print(
            f"tokens freed per call @{name}: evict(64) {freed[name, 64]:.0f}, "
            f"evict(6400) {freed[name, 6400]:.0f}"
        )
    # seconds per call ratios: the same amount evicted costs the same at any tree size, and
    # 100x the amount costs about 100x
    print(f"evict 64 tokens @1M / @10k = {ev64['10k'] / ev64['1M']:.2f}  (time ratio; ~1 expected)")
    print(
        f"evict 6400 tokens @1M / @10k = {ev6400['10k'] / ev6400['1M']:.2f}  (time ratio; ~1 expected)"
    )
    for name in SIZES:
        print(
            f"evict 6400 / evict 64 tokens @{name} = {ev64[name] / ev6400[name]:.1f}  "
            f"(time ratio; ~100 expected)"
        )
    for name in SIZES:  # seconds per call = fixed + nodes * per_node; 1 node vs 100 nodes
        per_node = (1 / ev6400[name] - 1 / ev64[name]) / 99
        fixed = 1 / ev64[name] - per_node
        print(
            f"evict cost @{name}: {per_node * 1e6:.0f} us per 64-token node + "
            f"{fixed * 1e6:.0f} us per call (receipt, counters)"
        )
    print(f"match_prefix @1M / @10k = {match['10k'] / match['1M']:.2f}  (time ratio)")
    print(f"total {time.perf_counter() - t_start:.0f}s")


if __name__ == "__main__":
    main()
