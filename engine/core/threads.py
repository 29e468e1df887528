"""How many CPU threads torch runs on. Torch-free.

``--threads`` wins; else ``OMP_NUM_THREADS`` (torch honoured it already); else one thread per
CPU this process may use: its affinity, capped by a cgroup CPU quota (``docker --cpus``, which
torch's own default does not read), shared among the ranks a spawned tensor-parallel group
runs on this machine.

How OpenMP workers wait is left to libgomp (torch's CPU wheels load ``torch/lib/libgomp.so.1``):
they spin before they sleep. Behind a busy neighbour the spinners take the cores the working
threads need (a 10-token request: 0.22 s alone, 0.76 s behind one spinning process, 0.99 s
behind another torch process, 15-30 s once behind a whole test suite; bench/busy_neighbour.py).
``OMP_WAIT_POLICY=PASSIVE`` in the environment at start bounds that (0.38-0.44 s in the same
cases) but halves decode on a quiet machine (one stream 54.8 -> 26.6 tok/s, 32 streams 359.0
-> 242.4, bench/decode_batch.py), so it is the operator's switch for a shared host, not the
default. libgomp reads it when it loads (``import torch``): it must be set before the engine
starts, as a variable of the command (measured: set later, it changes nothing).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path


def choose_threads(
    configured: int | None, env: Mapping[str, str], cpus: int, ranks: int = 1
) -> int | None:
    """Torch's intra-op thread count; None: leave torch's (it followed ``OMP_NUM_THREADS``).
    ``cpus``: the CPUs this process may use; ``ranks``: the engine's processes sharing them."""
    if configured:
        return configured
    if env.get("OMP_NUM_THREADS", "").strip():
        return None
    return max(1, cpus // max(1, ranks))


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity, capped by a cgroup CPU quota."""
    cpus = len(os.sched_getaffinity(0))
    quota = _cgroup_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota else cpus


def _cgroup_quota() -> float | None:
    """CPUs' worth of time the cgroup allows (``docker --cpus``); None: no quota or unknown."""
    try:
        v2 = Path("/sys/fs/cgroup/cpu.max")
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
        else:
            v1 = Path("/sys/fs/cgroup/cpu")
            quota = (v1 / "cpu.cfs_quota_us").read_text().strip()
            period = (v1 / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None
