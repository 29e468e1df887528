"""The C heap keeps what a step frees (engine/core/heap.py): a block allocated again is not
faulted in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.core import heap

# A child process (the setting is its whole process's): a 64 MiB block (over glibc's largest
# own mmap threshold) malloc'd, every page written, freed, four times; the minor page faults
# of the last three, after keep_freed() unless told "system".
CHILD = r"""
import ctypes, resource, sys
from engine.core.heap import keep_freed
fields = keep_freed({"ATTEST_HEAP": sys.argv[1]})
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
n, faults = 64 << 20, []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(ctypes.c_size_t(n))
    ctypes.memset(p, 1, n)
    libc.free(ctypes.c_void_p(p))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(fields["heap"], sum(faults[1:]))
"""


def _child(script: str, *args: str) -> list[str]:
    """What ``script`` prints, run in a process of its own (the heap's setting is a process's)."""
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=True
    ).stdout.split()


def _faults(how: str) -> tuple[str, int]:
    out = _child(CHILD, how)
    return out[0], int(out[1])


@pytest.mark.skipif(heap._glibc() is None, reason="glibc's mallopt is what is set")
def test_a_block_freed_and_allocated_again_is_not_faulted_in_again():
    pages = (64 << 20) // 4096
    how, kept = _faults("keep")
    assert how == "keep"
    assert kept < pages // 16  # the block's pages stayed the process's
    how, given = _faults("system")
    assert how == "system"
    assert given > 2 * pages  # glibc's own: each of the three faulted the block in again


# A child process: a 64 MiB block kept after its free, then given back; its resident KiB each time.
GIVE_BACK = r"""
import ctypes
from engine.core.heap import give_back, keep_freed
assert keep_freed({})["heap"] == "keep"
assert keep_freed({"ATTEST_HEAP": "system"})["heap"] == "keep"  # kept, it stays kept
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
def resident():
    return int(next(ln for ln in open("/proc/self/status") if ln.startswith("VmRSS:")).split()[1])
before = resident()
p = libc.malloc(ctypes.c_size_t(64 << 20))
ctypes.memset(p, 1, 64 << 20)
libc.free(ctypes.c_void_p(p))
kept = resident()
give_back()
print(before, kept, resident())
"""


@pytest.mark.skipif(heap._glibc() is None, reason="glibc's malloc_trim is what is called")
def test_what_the_heap_kept_is_given_back_when_asked():
    """The load's temporaries, freed, stay the process's until ``give_back`` (the engine calls
    it once after the load, before the pool's sizing reads the free memory)."""
    before, kept, given = (int(v) for v in _child(GIVE_BACK))
    assert kept - before > 60 * 1024  # the freed block's 64 MiB still resident
    assert kept - given > 60 * 1024  # and given back


def test_the_heaps_switch_is_named_in_its_error_and_system_sets_nothing(monkeypatch):
    with pytest.raises(ValueError, match="ATTEST_HEAP must be keep or system, got 'tcmalloc'"):
        heap.keep_freed({"ATTEST_HEAP": "tcmalloc"})
    monkeypatch.setattr(heap, "_glibc", lambda: pytest.fail("system touches no threshold"))
    monkeypatch.setattr(heap, "_kept", False)
    assert heap.keep_freed({"ATTEST_HEAP": "system"}) == {
        "heap": "system",
        "heap_why": "ATTEST_HEAP=system",
    }
    # a heap kept earlier in the process stays kept, and an engine told system says so
    monkeypatch.setattr(heap, "_kept", True)
    assert heap.keep_freed({"ATTEST_HEAP": "system"})["heap"] == "keep"


def test_another_c_library_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr(heap, "_glibc", lambda: None)
    assert heap.keep_freed({}) == {"heap": "system", "heap_why": "not glibc"}
    heap.give_back()  # nothing to call, and no error
