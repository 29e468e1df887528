"""Integer products for fast mode's int4 and int8 matrices where the CPU has AVX-512 VNNI:
``torch.ops.attest.int4_vnni_mm`` and ``int8_vnni_mm`` (``kernels/cpu_int.cpp``) quantise each
activation row to 8 bits per group of 32 columns and multiply with ``vpdpbusd`` (4- or 8-bit
weights times 8-bit activations summed in int32, 16 output rows a vector), accumulating the
groups' scales in float32. The weights are the same values and scales as torch's packed kernels'
(``engine.model.quant.quantize_int4`` / ``quantize_int8``), laid out again at load
(``pack_int4`` / ``pack_int8``); only the activations differ (8 bits per group instead of
bfloat16).

Each row's result is computed from that row alone in a fixed order, so its bits do not depend on
the other rows of the product (the speculator and a prefix hit rely on that). Where the CPU has
AMX's int8 tiles, an int8 product of ``tiles_from()`` rows or more runs on them: the same integer
sums per group (a tile product, signed times signed, over a group's 32 columns of 16 rows and 16
output rows), scaled and added in the same order, so the same bits as the vector kernel; a tile
product costs as much for one row as for 16, so fewer rows keep the vector kernel.

``reference_int4`` and ``reference_int8`` are the same arithmetic in torch (float64), which the
tests compare the kernels with.
"""

from __future__ import annotations

import os

import torch

from kernels import cpu_ops

GROUP = 32  # input columns per scale (quant.py's int4 group)
ROWS = 16  # output rows per block (a vector lane each)
FLAGS = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512_vnni"})


def int_vnni_native(flags: frozenset[str]) -> bool:
    """Whether this CPU has the instructions, the native ops are built for it with the kernel,
    and ``ATTEST_INT_VNNI=0`` does not turn it off (to measure against, or to rule it out)."""
    if os.environ.get("ATTEST_INT_VNNI", "").strip() == "0" or not FLAGS <= flags:
        return False
    return cpu_ops.load() and bool(torch.ops.attest.int_vnni_built())


def tiles_from() -> int:
    """From how many rows an int8 product runs on AMX's int8 tiles instead of the vector kernel
    (the same bits either way), 0 where it never does: the CPU lacks them, the native ops were
    built without them, Linux refuses the process their state, or ``ATTEST_INT_TILES=0`` (read
    once a process, at its first integer product)."""
    if not cpu_ops.load():
        return 0
    return int(torch.ops.attest.int8_tiles_from())


def fits(n: int, k: int) -> bool:
    """Whether an n x k matrix has the kernels' shape: rows in blocks of 16, columns in groups
    of 32."""
    return n % ROWS == 0 and k % GROUP == 0


def _check(n: int, k: int) -> None:
    if not fits(n, k):
        raise ValueError(
            f"integer products need rows in blocks of {ROWS} and columns in groups "
            f"of {GROUP}, not {n} x {k}"
        )


def pack_int4(
    q: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w ~= q * scale + lo`` (q [N, K] in [0, 15], scale and lo [N, K / 32]) in the kernel's
    layout (``kernels/cpu_int.cpp``): packed [N / 16, G, 4, 64] uint8, per block of 16 rows and
    group of 32 columns four vectors whose lane r holds row r's columns 8j .. 8j + 3 in the low
    nibbles and 8j + 4 .. 8j + 7 in the high ones; scales [N / 16, G, 2, 16] bfloat16."""
    n, k = q.shape
    _check(n, k)
    g = k // GROUP
    # [block, row, group, j, half, byte] -> [block, group, j, half, row, byte]
    qb = q.to(torch.uint8).reshape(n // ROWS, ROWS, g, 4, 2, 4).permute(0, 2, 3, 4, 1, 5)
    packed = qb[:, :, :, 0] | (qb[:, :, :, 1] << 4)  # [block, group, j, row, byte]
    packed = packed.reshape(n // ROWS, g, 4, 64)
    sc = torch.stack([scale, lo]).reshape(2, n // ROWS, ROWS, g).permute(1, 3, 0, 2)
    return packed.contiguous(), sc.to(torch.bfloat16).contiguous()


def quantise_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row and group of 32 columns, in float32 as the kernel: d = max |x| / 127,
    a = round(x * (127 / max |x|)) in [-127, 127] (ties to even)."""
    t, k = x.shape
    g = x.float().reshape(t, k // GROUP, GROUP)
    amax = g.abs().amax(dim=-1, keepdim=True)
    # a true division (a scalar over a tensor is a reciprocal times the scalar in torch)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax.clamp(min=1e-38), 0.0)
    a = torch.round(g * inv).clamp(-127, 127)
    return a.reshape(t, k).double(), (amax / 127.0).squeeze(-1).double()


def reference_int4(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor
) -> torch.Tensor:
    """The kernel's arithmetic in float64: 8-bit activations per group, the weights' scales and
    minimums rounded to bfloat16 as the kernel holds them."""
    t, k = x.shape
    a, d = quantise_activations(x.float())
    s = scale.to(torch.bfloat16).double()
    m = lo.to(torch.bfloat16).double()
    qa = (a.reshape(t, 1, k // GROUP, GROUP) * q.double().reshape(1, -1, k // GROUP, GROUP)).sum(-1)
    sums = a.reshape(t, k // GROUP, GROUP).sum(-1)  # [T, G]
    return (qa * s[None] * d[:, None]).sum(-1) + (m[None] * (d * sums)[:, None]).sum(-1)


def pack_int8(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w ~= q * scale[:, None]`` (q [N, K] in [-127, 127]) in the kernel's layout: packed
    [N / 16, G, 8, 64] int8, per block of 16 rows and group of 32 columns eight vectors whose
    lane r holds row r's columns 4j .. 4j + 3; scales [N / 16, G + 1, 16] float32, each group's
    128 * sum(q) (the kernel's activations are a + 128) and last the rows' scales."""
    n, k = q.shape
    _check(n, k)
    g = k // GROUP
    # [block, row, group, j, byte] -> [block, group, j, row, byte]
    packed = q.to(torch.int8).reshape(n // ROWS, ROWS, g, 8, 4).permute(0, 2, 3, 1, 4)
    sums = q.long().reshape(n // ROWS, ROWS, g, GROUP).sum(-1).permute(0, 2, 1) * 128
    scales = torch.cat([sums.float(), scale.float().reshape(n // ROWS, 1, ROWS)], dim=1)
    return packed.reshape(n // ROWS, g, 8, 64).contiguous(), scales.contiguous()


def reference_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``int8_vnni_mm``'s arithmetic in float64: 8-bit activations per group."""
    t, k = x.shape
    a, d = quantise_activations(x.float())
    qa = (a.reshape(t, 1, k // GROUP, GROUP) * q.double().reshape(1, -1, k // GROUP, GROUP)).sum(-1)
    return (qa * d[:, None]).sum(-1) * scale.double()[None]
