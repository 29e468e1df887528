"""Integer products where the CPU has them: an int8 matrix multiplied by activations quantised
to 8 bits per row, the dot products in integers (VNNI's ``vpdpbusd`` on AVX-512 VNNI / AVX-VNNI
CPUs), through FBGEMM's dynamic quantised linear (``torch.ops.quantized.linear_dynamic``).

FBGEMM is torch's own x86 int8 GEMM library: it packs the weights once at load in the layout its
kernels want and, for each product, quantises the activations and accumulates in int32. It is
used instead of a hand-written kernel; see BENCHMARKS.md for what it is worth here.

FBGEMM quantises the activations **per product** (one scale and zero point for the whole input),
so a row's result would depend on the rows it shares a product with. Here every row is first
divided by its largest magnitude, and one extra row of [e, -e, 0, ...] (e = 128 / 127, a step
above any scaled row's largest, rounding included) fixes the product's range at [-e, e]
whatever the other rows hold: each row is then
quantised to the same grid as it would be alone (255 steps across twice its largest magnitude), its integer dot
products are exact, and the float output of every element is computed from its row and column
alone. So a row's result is the same bits in any batch (``tests/unit/test_vnni.py``), as the
speculator and a prefix hit need, and the result is multiplied back by the row's scale.

The weights are the same int8 values and per-row scales as the packed int8 kernel's
(``engine.model.quant.quantize_int8``); only the activations differ (8 bits instead of
bfloat16's).
"""

from __future__ import annotations

import os
import warnings

import torch

VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
_ENGINE = "fbgemm"
_EDGE = 128.0 / 127.0  # the extra row's magnitude: above any scaled row's largest (1, rounded)


def vnni_native(flags: frozenset[str]) -> bool:
    """Whether this CPU has integer dot products and torch has FBGEMM to use them, unless
    ``ATTEST_VNNI=0`` in the environment turns them off (to measure against, or to rule them
    out)."""
    if os.environ.get("ATTEST_VNNI", "").strip() == "0":
        return False
    return bool(VNNI_FLAGS & flags) and _ENGINE in torch.backends.quantized.supported_engines


class Int8Vnni:
    """``x @ w.T`` for an int8 matrix ``w ~= q * scale[:, None]``, by FBGEMM."""

    __slots__ = ("_packed", "_edge", "out_features")

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        n = q.shape[0]
        old = torch.backends.quantized.engine
        with warnings.catch_warnings():  # torch marks its quantised tensors as deprecated
            warnings.simplefilter("ignore")
            torch.backends.quantized.engine = _ENGINE  # the packing is the engine's
            try:
                qt = torch._make_per_channel_quantized_tensor(
                    q.contiguous(), scale.double(), torch.zeros(n, dtype=torch.long), 0
                )
                self._packed = torch.ops.quantized.linear_prepack(qt, None)
            finally:
                torch.backends.quantized.engine = old
        self.out_features = n
        self._edge = torch.zeros(1, q.shape[1])
        self._edge[0, 0], self._edge[0, 1] = _EDGE, -_EDGE

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """The product in float32 (the LM head's logits are kept in float32: no rounding to
        ``x``'s dtype and back); each row's bits do not depend on the other rows."""
        xf = x.float()
        s = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30)
        y = torch.ops.quantized.linear_dynamic(torch.cat([xf / s, self._edge]), self._packed, False)
        return y[:-1].mul_(s)
