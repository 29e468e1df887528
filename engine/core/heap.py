"""How the process's C heap keeps the memory a step frees. Torch-free.

Torch's CPU tensors come from the C library's ``malloc``. glibc's hands a block of more than its
mmap threshold (128 KiB at start, raised as such blocks are freed, 32 MiB at most) pages of its
own, unmapped again when the block is freed, and gives the top of its heap back to the system
past its trim threshold. A page given back is faulted in and zeroed again on its next touch,
and a step's activations are blocks of megabytes that the next step allocates again: a
bfloat16 prefill of 64 prompts of 128 tokens faulted 63,970-226,337 pages each time, and two
generates of such prompts (1 token, then 33) 169,038-582,625. While the model loaded, the
measure of its products' ways (``engine.model.orient``) ran in the faults of a heap still being
given back: at 512 rows it timed AMX's tiles at 2.45-2.75 ms where they take 1.58-1.75 once
loaded, and chose ``F.linear`` instead in 3 boots of 4. Kept, the same prefill faulted 40-3,604
pages, the two generates 903-1,869; 64 streams decoded 1.06x as fast in bfloat16, 1.15x in
float32 (BENCHMARKS.md, "2026-12-07 (heap)").

So the engine sets both thresholds to ``KEEP`` (``keep_freed``): a block under it comes from the
heap, and what a step frees stays there for the next step; a block over it (a large KV pool)
keeps pages of its own, given back when freed. What the load freed (its temporaries) is given
back once after it (``give_back``, glibc's ``malloc_trim``), so the pool's sizing reads memory
they no longer hold. This is what vLLM's CPU build asks of tcmalloc, preloaded; glibc's own
switches need nothing installed. The setting is the process's and holds once made: an engine
told ``ATTEST_HEAP=system`` after another of its process kept the heap says so.
``boot.pool_sized`` records it (``heap``). ``ATTEST_HEAP=system`` leaves glibc's own; with
another C library nothing is set.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from functools import cache

KEEP = 1 << 30  # bytes: a block under it comes from the heap; this much freed stays there
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
_kept = False  # whether this process's heap was set to keep (it stays so)


@cache
def _glibc() -> ctypes.CDLL | None:
    """The process's C library where it is glibc (it has ``mallopt`` and ``malloc_trim``)."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not all(hasattr(libc, f) for f in ("gnu_get_libc_version", "mallopt", "malloc_trim")):
        return None
    return libc


def keep_freed(env: Mapping[str, str] = os.environ) -> dict[str, object]:
    """Set glibc's thresholds to ``KEEP`` unless ``ATTEST_HEAP=system``; the fields that say
    what the heap does (``boot.pool_sized``): ``heap`` ``keep`` with ``heap_bytes``, or
    ``system`` with ``heap_why``."""
    global _kept
    how = env.get("ATTEST_HEAP", "").strip()
    if how not in ("", "keep", "system"):
        raise ValueError(f"ATTEST_HEAP must be keep or system, got {how!r}")
    if how == "system":
        if _kept:
            why = "ATTEST_HEAP=system, but an earlier engine of this process kept the heap"
            return {"heap": "keep", "heap_bytes": KEEP, "heap_why": why}
        return {"heap": "system", "heap_why": "ATTEST_HEAP=system"}
    libc = _glibc()
    if libc is None:
        return {"heap": "system", "heap_why": "not glibc"}
    for param in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD):
        if libc.mallopt(param, KEEP) != 1:
            return {"heap": "system", "heap_why": f"mallopt({param}, {KEEP}) refused"}
    _kept = True
    return {"heap": "keep", "heap_bytes": KEEP}


def give_back() -> None:
    """Give the system the heap's free pages (glibc's ``malloc_trim``); elsewhere nothing."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
