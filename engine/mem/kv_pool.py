"""KVPool: per-layer K and V tensors ``[slots, kv_heads, head_dim]`` in the engine dtype."""

from __future__ import annotations

import torch

from kernels.attention import LayerKV


class KVPool:
    def __init__(
        self, num_layers: int, slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> None:
        # slot 0 is the padding slot; usable slots are [1, slots]
        self.size = slots
        self.dtype = dtype
        self.layers = [
            LayerKV(
                torch.zeros(slots + 1, kv_heads, head_dim, dtype=dtype),
                torch.zeros(slots + 1, kv_heads, head_dim, dtype=dtype),
            )
            for _ in range(num_layers)
        ]
        self.bytes_per_token = 2 * num_layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_token * (self.size + 1)
