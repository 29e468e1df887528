"""Which way a dense product runs on this CPU, measured once at load.

A product ``x @ w.T`` of ``n`` rows can run as ``F.linear(x, w)`` (transformers' own call) or as
``(w @ x.T).T`` (one row padded to two, since a one-column product falls to the slow
matrix-vector path). Which is faster depends on the CPU, and this machine kind's CPU changes:
on an AMD EPYC (AVX-512) the second ran one float32 row 1.9x faster, four rows 2.7x, 64 rows
1.2x; on an Intel Xeon (AVX-512, AMX) one float32 row ran 2-3x slower that way (one layer's four
products: 543 us against 261; the default model's LM head 7.0 ms against 2.3), faster at 8-16
rows, level at 64, and 3 % behind at 512 (BENCHMARKS.md; ``bench/dense_ways.py`` times them).
A choice fixed for one CPU is wrong on the other, so the model measures both at load, for its
own matrices in its own dtype (one layer's four, and the LM head apart: its shape is unlike
theirs; in fast mode their dense values, which products past the packed kernel's rows take) at
each of ``ROWS``, and a product of ``n`` rows takes the choice of the largest of ``ROWS`` not
above ``n``. Where the two are within a few per cent (here a layer's 64 and 512 rows in float32)
one boot may pick either; ``boot.weights`` records what it picked (``orient``), and
``ATTEST_ORIENT=linear`` or ``mm`` fixes one way instead.

Both give products of the same values; only the order of the sums inside the GEMM differs, as
it does between batch sizes anyway (exact mode's token-exact tests against transformers pass
either way, ``tests/integration/test_loaders.py``).

A third way, measured beside the two where the caller hands ``measure`` the weights packed
(``pack``: on a CPU, ``engine.model.llama``; in fast mode its dense values): a copy of the weight
laid out once (``packed_linear``). Where the CPU has AMX's bfloat16 tiles and the native ops are
built, a bfloat16 matrix of whole 32s of rows and columns is laid out for the native product on
the tiles (``kernels/cpu_dense.cpp``: 1.03-1.46x oneDNN's packed product over the default
model's 30 layers at 1 to 512 rows, BENCHMARKS.md; ``ATTEST_DENSE_TILES=0`` turns it off);
where the native ops are built with AVX-512, a float32 matrix of whole 32s of rows is laid out
for the native float32 product (``kernels/cpu_dense_vec.cpp``: 1.35-1.51x oneDNN's packed product
over the default model's 30 layers at 8 to 64 rows, level from 256, BENCHMARKS.md;
``ATTEST_DENSE_F32=0`` turns it off); where the native ops are built with AVX-512 BF16 and the
CPU has no AMX tiles, a bfloat16 matrix of whole 32s of rows and an even number of columns is
laid out for the native bfloat16 product on vectors (the same file: each column's pairs of
weights side by side for vdpbf16ps; over the default model's 30 layers on an AMD EPYC
(family 26) 1.27x oneDNN's packed product at 1 row, 1.66x at 16, 1.45x at 64, 1.15x at 128 and
0.95x at 512, BENCHMARKS.md; ``ATTEST_DENSE_PAIRS=0`` turns it off); elsewhere it is oneDNN's
linear on the weight in its blocked form. Unpacked, a bfloat16 product through oneDNN lays the weight out again on every
call: on an AMD EPYC (Zen 4, AVX-512 BF16) the default model's bfloat16 LM head took 23-34 ms a
row that way and 5.0 ms packed, one thread (BENCHMARKS.md). oneDNN's packed bfloat16 product
gives ``F.linear``'s bits; the tiles' sums the same products in another order (each float32 sum
rounded once to bfloat16), as float32's packed ways (oneDNN's GEMM, not MKL's; the native one,
each sum over K in order, whatever its batch) and ``(w @ x.T).T`` do. The copy costs the
weight's bytes again, so it is kept only for a part (layers, head) where some bucket takes it.
A layer's gate/up matrix is laid out gated on the tiles (``pack(w, gated=True)``): its product
is the MLP's activation, silu(gate) * up with ``silu_mul``'s bits, made as the sums leave the
tiles (``gated_linear``), so the [rows, 2n] product is never written and read back (at 512 rows
the 30 layers' gate/up products and SiLU took 31.5-32.2 ms so against 34.9-53.1, BENCHMARKS.md);
the bfloat16 product on vectors lays it out and makes it the same way.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from kernels import cpu_ops
from kernels.timing import fastest_each

ROWS = (1, 2, 4, 8, 16, 64, 256, 512)  # the row counts measured; a product takes the bucket below
HEAD_ROWS = (1, 2, 4, 8, 16, 64)  # the LM head sees a row per sequence sampled
PACK_ROWS = 64  # the row count oneDNN lays a packed weight out for (it runs any count)


@dataclass(frozen=True, slots=True)
class Orientation:
    """Per bucket of ``rows``: whether a product takes ``(w @ x.T).T`` (True) or ``F.linear``;
    with ``packed``, whether it takes the packed weight instead of either."""

    rows: tuple[int, ...]
    mm: tuple[bool, ...]
    packed: tuple[bool, ...] = ()  # empty: never packed

    def _bucket(self, n: int) -> int:
        return max(0, bisect.bisect_right(self.rows, n) - 1)

    def takes_mm(self, n: int) -> bool:
        return self.mm[self._bucket(n)]

    def takes_packed(self, n: int) -> bool:
        return bool(self.packed) and self.packed[self._bucket(n)]

    @property
    def uses_packed(self) -> bool:
        return any(self.packed)

    def fields(self) -> list[int]:
        """The buckets that take ``(w @ x.T).T``, for the boot receipt."""
        return [r for r, m in zip(self.rows, self.mm) if m]

    def packed_fields(self) -> list[int]:
        """The buckets that take the packed weight, for the boot receipt."""
        return [r for r, p in zip(self.rows, self.packed) if p]


def by_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` as ``(w @ x.T).T``; one row padded to two."""
    if x.shape[0] == 1:
        return torch.mm(w, torch.cat([x, torch.zeros_like(x)]).t())[:, :1].t()
    return torch.mm(w, x.t()).t()


def by_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``by_mm``'s product laid out row by row, as the forward reads it: ``(w @ x.T).T`` is a
    transposed view, and what follows a product reads rows (the native norm, SiLU times up and
    the sampler take dense rows; on a transposed view the forward fell back to torch's ops, and
    the LM head's logits, sampled in that layout, cost a 64-stream bfloat16 step 10 ms more
    than their copy). So the mm way is measured, and runs, with that copy."""
    return by_mm(x, w).contiguous()


def _native_product(switch: str, built: str) -> bool:
    """Whether a native product runs: the native ops loaded, ``attest::<built>`` true, and not
    turned off by ``<switch>=0``."""
    if os.environ.get(switch, "").strip() == "0" or not cpu_ops.load():
        return False
    return bool(getattr(torch.ops.attest, built)())


@cache
def dense_f32() -> bool:
    """Whether float32 matrices are laid out for the native float32 product: the native ops
    built with AVX-512 and not turned off by ``ATTEST_DENSE_F32=0``."""
    return _native_product("ATTEST_DENSE_F32", "dense_f32_built")


@cache
def dense_pairs() -> bool:
    """Whether bfloat16 matrices are laid out for the native bfloat16 product on vectors where
    AMX's tiles are not: the native ops built with AVX-512 BF16 and not turned off by
    ``ATTEST_DENSE_PAIRS=0``."""
    return _native_product("ATTEST_DENSE_PAIRS", "dense_pairs_built")


@cache
def dense_tiles() -> bool:
    """Whether bfloat16 matrices are laid out for the native product on AMX's tiles: the native
    ops built with it, Linux lending the tiles, and not turned off by ``ATTEST_DENSE_TILES=0``."""
    return _native_product("ATTEST_DENSE_TILES", "dense_tiles_built")


def pack(w: torch.Tensor, gated: bool = False) -> torch.Tensor | None:
    """``w`` ([out, in], bfloat16 or float32, on the CPU) laid out once (a second copy): in
    bfloat16 for the native product on AMX's tiles where ``dense_tiles`` and its shape takes
    them, else for the native bfloat16 product on vectors where ``dense_pairs`` and its shape
    takes them, in float32 for the native float32 product where ``dense_f32`` and its shape
    takes them, else as oneDNN's linear takes it; None where neither can take ``w``. ``gated``: ``w``
    is a gate/up matrix (gate's rows, then up's), and for the tiles or the bfloat16 product on
    vectors it is laid out gated, for ``gated_linear`` (``packed_linear`` on it gives its columns
    in the layout's order)."""
    ok = w.device.type == "cpu" and w.dim() == 2 and w.dtype in (torch.bfloat16, torch.float32)
    if not ok:
        return None
    if w.dtype == torch.bfloat16 and dense_tiles() and torch.ops.attest.tile_shape(*w.shape):
        return torch.ops.attest.tile_pack(w, gated)
    if w.dtype == torch.bfloat16 and dense_pairs() and torch.ops.attest.pairs_shape(*w.shape):
        return torch.ops.attest.pairs_pack(w, gated)
    if w.dtype == torch.float32 and dense_f32() and torch.ops.attest.f32_shape(*w.shape):
        return torch.ops.attest.f32_pack(w)
    if not torch.backends.mkldnn.is_available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACK_ROWS)


def on_tiles(packed: torch.Tensor) -> bool:
    """Whether ``packed`` (from ``pack``) is laid out for the tiles' product (its blocks of 32
    columns, ``[N / 32, K / 32, 2, 16, 32]``) rather than oneDNN's."""
    return packed.dim() == 5


def on_f32(packed: torch.Tensor) -> bool:
    """Whether ``packed`` (from ``pack``) is laid out for the native float32 product (its
    blocks of 32 columns, ``[N / 32, K, 32]``) rather than oneDNN's."""
    return packed.dim() == 3


def on_pairs(packed: torch.Tensor) -> bool:
    """Whether ``packed`` (from ``pack``) is laid out for the native bfloat16 product on vectors
    (its blocks of 32 columns, each column's pairs of weights side by side, ``[N / 32, K / 2,
    32, 2]``) rather than oneDNN's."""
    return packed.dim() == 4


def packed_linear(x: torch.Tensor, packed: torch.Tensor, widen: bool = False) -> torch.Tensor:
    """``x @ w.T`` on ``pack(w)``; ``widen``: in float32 where the product can store it so (on
    the tiles or the native bfloat16 product on vectors: its bfloat16 sums widened as they are
    stored, the numbers ``.float()`` of the bfloat16 product gives, without that product in
    memory), else in ``x``'s dtype."""
    if on_tiles(packed):
        return torch.ops.attest.tile_linear(x, packed, widen)
    if on_pairs(packed):
        return torch.ops.attest.pairs_linear(x, packed, widen)
    if on_f32(packed):
        return torch.ops.attest.f32_linear(x, packed)
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def gated_linear(
    x: torch.Tensor, packed: torch.Tensor, silu_mul: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``silu_mul(x @ w.T)`` on ``pack(w, gated=True)`` (``w`` a gate/up matrix): on the tiles,
    silu(gate) * up as the product's sums leave the tiles, with ``silu_mul``'s bits and without
    the product's [rows, 2n] in memory (``kernels/cpu_dense.cpp``), and likewise on the
    bfloat16 product on vectors (``kernels/cpu_dense_vec.cpp``); elsewhere ``silu_mul`` of
    ``packed_linear``."""
    if on_tiles(packed):
        return torch.ops.attest.tile_gated_linear(x, packed)
    if on_pairs(packed):
        return torch.ops.attest.pairs_gated_linear(x, packed)
    return silu_mul(packed_linear(x, packed))


def measure(
    mats: Sequence[torch.Tensor],
    rows: tuple[int, ...] = ROWS,
    clock: Callable[[], float] = time.perf_counter,
    packs: Sequence[torch.Tensor] | None = None,
) -> tuple[Orientation, dict[int, tuple[float, ...]]]:
    """The faster way for ``mats`` (all their products of ``n`` rows together) at each of
    ``rows``; with the seconds each way took, ``{n: (linear, mm)}``, and with ``packs`` (``mats``
    packed, ``pack``) the packed way timed too, ``{n: (linear, mm, packed)}``. Each way is timed
    as the forward runs it, its product laid out row by row (``by_rows``)."""
    g = torch.Generator().manual_seed(0)
    took: dict[int, tuple[float, ...]] = {}
    for n in rows:
        xs = [torch.randn(n, w.shape[1], generator=g, dtype=w.dtype) for w in mats]
        ways = [
            lambda: [F.linear(x, w) for x, w in zip(xs, mats)],  # noqa: B023
            lambda: [by_rows(x, w) for x, w in zip(xs, mats)],  # noqa: B023
        ]
        if packs is not None:
            ways.append(lambda: [packed_linear(x, p) for x, p in zip(xs, packs)])  # noqa: B023
        took[n] = tuple(fastest_each(ways, clock=clock))
    best = [min(range(len(t)), key=t.__getitem__) for t in took.values()]
    packed = tuple(b == 2 for b in best) if packs is not None else ()
    return Orientation(rows, tuple(b == 1 for b in best), packed), took


def choose(
    mats: Sequence[torch.Tensor],
    rows: tuple[int, ...] = ROWS,
    packs: Sequence[torch.Tensor] | None = None,
) -> Orientation:
    """``measure``'s choice (the packed way among them with ``packs``), unless ``ATTEST_ORIENT``
    is ``linear``, ``mm`` or ``packed`` (one way at every size: to measure against, or to rule
    the choice out; ``packed`` only where ``packs`` are given)."""
    how = os.environ.get("ATTEST_ORIENT", "").strip()
    if how in ("linear", "mm"):
        return Orientation((1,), (how == "mm",))
    if how == "packed":
        if packs is None:
            raise ValueError("ATTEST_ORIENT=packed: this torch has no oneDNN to pack weights for")
        return Orientation((1,), (False,), (True,))
    if how not in ("", "measure"):
        raise ValueError(f"ATTEST_ORIENT must be linear, mm, packed or measure, got {how!r}")
    return measure(mats, rows, packs=packs)[0]
