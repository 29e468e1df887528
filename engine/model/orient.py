"""Which way a dense product runs on this CPU, measured once at load.

A product ``x @ w.T`` of ``n`` rows can run as ``F.linear(x, w)`` (transformers' own call) or as
``(w @ x.T).T`` (one row padded to two, since a one-column product falls to the slow
matrix-vector path). Which is faster depends on the CPU, and this machine kind's CPU changes:
on an AMD EPYC (AVX-512) the second ran one float32 row 1.9x faster, four rows 2.7x, 64 rows
1.2x; on an Intel Xeon (AVX-512, AMX) one float32 row ran 2-3x slower that way (one layer's four
products: 543 us against 261; the default model's LM head 7.0 ms against 2.3), faster at 8-16
rows, level at 64, and 3 % behind at 512 (BENCHMARKS.md; ``bench/dense_ways.py`` times them).
A choice fixed for one CPU is wrong on the other, so the model measures both at load, for its
own matrices in its own dtype (one layer's four, and the LM head apart: its shape is unlike
theirs; in fast mode their dense values, which products past the packed kernel's rows take) at
each of ``ROWS``, and a product of ``n`` rows takes the choice of the largest of ``ROWS`` not
above ``n``. Where the two are within a few per cent (here a layer's 64 and 512 rows in float32)
one boot may pick either; ``boot.weights`` records what it picked (``orient``), and
``ATTEST_ORIENT=linear`` or ``mm`` fixes one way instead.

Both give products of the same values; only the order of the sums inside the GEMM differs, as
it does between batch sizes anyway (exact mode's token-exact tests against transformers pass
either way, ``tests/integration/test_loaders.py``).
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ROWS = (1, 2, 4, 8, 16, 64, 256, 512)  # the row counts measured; a product takes the bucket below
HEAD_ROWS = (1, 2, 4, 8, 16, 64)  # the LM head sees a row per sequence sampled
REPS = 3  # timed calls per row count and way, after one warm call; the fastest counts


@dataclass(frozen=True, slots=True)
class Orientation:
    """Per bucket of ``rows``: whether a product takes ``(w @ x.T).T`` (True) or ``F.linear``."""

    rows: tuple[int, ...]
    mm: tuple[bool, ...]

    def takes_mm(self, n: int) -> bool:
        return self.mm[max(0, bisect.bisect_right(self.rows, n) - 1)]

    def fields(self) -> list[int]:
        """The buckets that take ``(w @ x.T).T``, for the boot receipt."""
        return [r for r, m in zip(self.rows, self.mm) if m]


def by_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` as ``(w @ x.T).T``; one row padded to two."""
    if x.shape[0] == 1:
        return torch.mm(w, torch.cat([x, torch.zeros_like(x)]).t())[:, :1].t()
    return torch.mm(w, x.t()).t()


def fastest(
    fn: Callable[[], object],
    reps: int = REPS,
    warm: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The fastest of ``reps`` calls of ``fn``, in seconds, after ``warm`` untimed ones."""
    for _ in range(warm):
        fn()
    best = float("inf")
    for _ in range(reps):
        t = clock()
        fn()
        best = min(best, clock() - t)
    return best


def measure(
    mats: Sequence[torch.Tensor],
    rows: tuple[int, ...] = ROWS,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[Orientation, dict[int, tuple[float, float]]]:
    """The faster way for ``mats`` (all their products of ``n`` rows together) at each of
    ``rows``; with the seconds each way took, ``{n: (linear, mm)}``."""
    g = torch.Generator().manual_seed(0)
    took: dict[int, tuple[float, float]] = {}
    for n in rows:
        xs = [torch.randn(n, w.shape[1], generator=g, dtype=w.dtype) for w in mats]
        lin = fastest(lambda: [F.linear(x, w) for x, w in zip(xs, mats)], clock=clock)  # noqa: B023
        mm = fastest(lambda: [by_mm(x, w) for x, w in zip(xs, mats)], clock=clock)  # noqa: B023
        took[n] = (lin, mm)
    return Orientation(rows, tuple(mm < lin for lin, mm in took.values())), took


def choose(mats: Sequence[torch.Tensor], rows: tuple[int, ...] = ROWS) -> Orientation:
    """``measure``'s choice, unless ``ATTEST_ORIENT`` is ``linear`` or ``mm`` (one way at every
    size: to measure against, or to rule the choice out)."""
    how = os.environ.get("ATTEST_ORIENT", "").strip()
    if how in ("linear", "mm"):
        return Orientation((1,), (how == "mm",))
    if how not in ("", "measure"):
        raise ValueError(f"ATTEST_ORIENT must be linear, mm or measure, got {how!r}")
    return measure(mats, rows)[0]
