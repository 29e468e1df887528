"""The default thread count (engine/core/threads.py)."""

from __future__ import annotations

import pytest

from engine.core.threads import choose_threads


@pytest.mark.parametrize(
    ("configured", "env", "cpus", "ranks", "want"),
    [
        (None, {}, 2, 1, 2),  # one thread per usable CPU
        (None, {}, 1, 1, 1),  # a process pinned to one CPU (taskset, a cpuset) gets one
        (None, {}, 8, 2, 4),  # two spawned ranks share the machine's CPUs
        (None, {}, 3, 4, 1),  # never fewer than one
        (3, {}, 2, 1, 3),  # --threads wins, even over the CPU count
        (3, {"OMP_NUM_THREADS": "1"}, 2, 1, 3),  # ... and over OMP_NUM_THREADS
        (None, {"OMP_NUM_THREADS": "1"}, 2, 1, None),  # torch followed the user's variable
        (None, {"OMP_NUM_THREADS": " "}, 2, 1, 2),  # a blank variable is no choice
    ],
)
def test_thread_count(configured, env, cpus, ranks, want):
    assert choose_threads(configured, env, cpus, ranks) == want
