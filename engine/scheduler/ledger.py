"""The ledger (law 7): every KV slot is in exactly one place.

``free + staged + cached + private == capacity``: free in the allocator, staged in its open
free group, owned by a radix node, or privately held by one running request.

The host tier, when there is one, has its own line: ``free + used == capacity``, free in its
allocator or held by a radix node as that node's host copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.memory.allocator import TokenAllocator
from engine.memory.radix import RadixCache
from engine.tiers.host_tier import HostTier


@dataclass(slots=True)
class LedgerReading:
    capacity: int
    free: int
    staged: int
    cached: int
    private: int

    @property
    def balanced(self) -> bool:
        return self.free + self.staged + self.cached + self.private == self.capacity

    def as_fields(self) -> dict[str, int]:
        return {
            "capacity": self.capacity,
            "free": self.free,
            "staged": self.staged,
            "cached": self.cached,
            "private": self.private,
        }


def read_ledger(allocator: TokenAllocator, cache: RadixCache | None, private: int) -> LedgerReading:
    return LedgerReading(
        capacity=allocator.capacity,
        free=allocator.available_size(),
        staged=allocator.staged_size(),
        cached=cache.total_size() if cache is not None else 0,
        private=private,
    )


@dataclass(slots=True)
class HostLedgerReading:
    capacity: int
    free: int
    used: int

    @property
    def balanced(self) -> bool:
        return self.free + self.used == self.capacity


def read_host_ledger(tier: HostTier) -> HostLedgerReading:
    return HostLedgerReading(tier.capacity, tier.alloc.available_size(), tier.used_size())


def ledger_violations(
    allocator: TokenAllocator, cache: RadixCache | None, private: int
) -> list[tuple[str, dict[str, object]]]:
    """Every broken invariant of the memory layer, as (kind, numbers); empty when all hold.
    Never raises: a check that itself fails is reported as a violation."""
    out: list[tuple[str, dict[str, object]]] = []
    reading = read_ledger(allocator, cache, private)
    if not reading.balanced:
        out.append(("ledger", reading.as_fields()))
    for name, obj in (("allocator", allocator), ("radix", cache)):
        if obj is None:
            continue
        try:
            obj.check()
        except Exception as e:
            out.append((name, {"error": f"{type(e).__name__}: {e}"}))
    tier = cache.tier if cache is not None else None
    if tier is not None:
        host = read_host_ledger(tier)
        if not host.balanced:
            out.append(
                ("host_ledger", {"capacity": host.capacity, "free": host.free, "used": host.used})
            )
        try:
            tier.check()
        except Exception as e:
            out.append(("host_tier", {"error": f"{type(e).__name__}: {e}"}))
    return out
