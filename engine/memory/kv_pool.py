"""KVPool: per-layer K and V tensors ``[slots, kv_heads, head_dim]`` in the engine dtype,
and how its size was chosen."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

from kernels.attention import LayerKV


@dataclass(slots=True)
class PoolSizing:
    """Which path sized the pool and its inputs (the ``boot.pool_sized`` receipt)."""

    path: str  # "configured": a token count was given; "measured": from free memory
    kv_tokens: int
    bytes_per_token: int
    page_size: int
    mem_available: int | None = None  # bytes the OS reported available (measured path)
    fraction: float | None = None  # share of it given to the pool (measured path)
    budget_bytes: int | None = None

    def as_fields(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def mem_available_bytes() -> int:
    """MemAvailable from /proc/meminfo; physical pages x page size where that is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def size_pool(
    kv_tokens: int | None, fraction: float, bytes_per_token: int, page_size: int
) -> PoolSizing:
    if kv_tokens is not None:
        tokens = kv_tokens - kv_tokens % page_size
        if tokens < page_size:
            raise ValueError(f"kv_tokens {kv_tokens} is less than one page of {page_size}")
        return PoolSizing("configured", tokens, bytes_per_token, page_size)
    avail = mem_available_bytes()
    budget = int(avail * fraction)
    tokens = budget // bytes_per_token
    tokens -= tokens % page_size
    if tokens < page_size:
        raise ValueError(
            f"a KV budget of {budget:,} bytes ({fraction} of {avail:,} available) holds no page "
            f"of {page_size} tokens at {bytes_per_token:,} bytes each; pass --kv-tokens"
        )
    return PoolSizing("measured", tokens, bytes_per_token, page_size, avail, fraction, budget)


class KVPool:
    def __init__(
        self,
        num_layers: int,
        pool_slots: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        pin: bool = False,  # page-locked host memory (a host tier beside a CUDA pool)
    ) -> None:
        # pool_slots includes the allocator's padding page
        self.pool_slots = pool_slots
        self.dtype = dtype
        shape = (pool_slots, kv_heads, head_dim)
        self.layers = [
            LayerKV(
                torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin),
                torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin),
            )
            for _ in range(num_layers)
        ]
        self.bytes_per_token = 2 * num_layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def take_over(self, other: KVPool) -> None:
        """Serve ``other``'s layers from now on (a pool resized under its residents, or one of
        another shape: a group's new layout)."""
        self.layers, self.pool_slots = other.layers, other.pool_slots
        self.bytes_per_token = other.bytes_per_token

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_token * self.pool_slots
