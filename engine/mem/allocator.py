"""TokenAllocator: hands out KV slots; never a partial allocation."""

from __future__ import annotations

import torch


class TokenAllocator:
    """Slots ``[1, capacity]`` of a KV pool. Slot 0 is reserved as a harmless padding target.

    Invariant: every slot is either free or in use, never both (``check()``).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._free = torch.arange(1, capacity + 1, dtype=torch.int64)
        self._in_use = torch.zeros(capacity + 1, dtype=torch.bool)

    def available_size(self) -> int:
        return int(self._free.numel())

    def used_size(self) -> int:
        return self.capacity - self.available_size()

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` slots, or None when fewer than ``n`` are free (nothing is taken then)."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} slots")
        if n > self._free.numel():
            return None
        out, self._free = self._free[:n], self._free[n:]
        self._in_use[out] = True
        return out

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        slots = slots.to(torch.int64).flatten()
        bad = (slots < 1) | (slots > self.capacity)
        if bool(bad.any()):
            raise ValueError(f"slot {int(slots[bad][0])} is not a slot of this pool")
        if not bool(self._in_use[slots].all()):
            idx = int(slots[~self._in_use[slots]][0])
            raise ValueError(f"slot {idx} freed while not allocated (double free?)")
        uniq, counts = slots.unique(return_counts=True)
        if bool((counts > 1).any()):
            raise ValueError(f"slot {int(uniq[counts > 1][0])} appears twice in one free")
        self._in_use[slots] = False
        self._free = torch.cat([self._free, slots])

    def check(self) -> None:
        """Conservation: free + in use == capacity, and the two sets are disjoint."""
        in_use = int(self._in_use.sum())
        if self.available_size() + in_use != self.capacity:
            raise AssertionError(
                f"allocator ledger: free {self.available_size()} + in use {in_use} "
                f"!= capacity {self.capacity}"
            )
        if bool(self._in_use[self._free].any()):
            raise AssertionError("a slot is both free and in use")
