"""Timing a few ways of doing one thing, at load, on a machine whose speed moves: each way's
fastest call, the ways taking turns call by call (``engine.model.orient``, fast mode's integer
bound, the torch backend's prefill kernel)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

REPS = 3  # timed calls per way, the ways in turn, after one warm call each; the fastest counts


def fastest(
    fn: Callable[[], object],
    reps: int = REPS,
    warm: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The fastest of ``reps`` calls of ``fn``, in seconds, after ``warm`` untimed ones."""
    return fastest_each([fn], reps, warm, clock)[0]


def fastest_each(
    fns: Sequence[Callable[[], object]],
    reps: int = REPS,
    warm: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Each of ``fns``' fastest of ``reps`` calls, in seconds, after ``warm`` untimed ones, the
    ways taking turns call by call: a spell of a busy machine then slows every way's calls
    alike, where ways timed one after the other had it fall on one way's calls alone."""
    for _ in range(warm):
        for fn in fns:
            fn()
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t = clock()
            fn()
            best[i] = min(best[i], clock() - t)
    return best
