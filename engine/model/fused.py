"""The small per-layer operations of the decoder, grouped as the forward uses them.

Between its matrix products a layer runs about twenty small operations (two RMSNorms, the
rotary embedding, SiLU times up, two residual adds), each a separate pass over a few kilobytes
with its own dispatch cost: at one decoding stream they take as long as the weights' products.
Grouped as ``norm``, ``rope``, ``add_norm`` (residual add, then the next norm) and
``silu_mul``, they run exactly the operations the reference implementation runs, in its
order, so exact mode keeps its tokens.

Where the native CPU ops are built (``kernels.cpu_ops``), ``rope`` and ``silu_mul`` are one
native call each in every mode (they give the same bits: the same roundings in the same order,
no fused multiply-adds, torch's own vector exp),
and with bfloat16 activations (fast mode, ``--dtype bfloat16``) so are ``norm`` and
``add_norm`` (at any number of rows where their loops are vector ones, ``norm_rows``). Exact
mode in float32 keeps torch's norm: a native sum of squares adds in another order, and that
mode's tokens are transformers' tokens.

Compiling each group (``torch.compile``, inductor's C++ backend, dynamic in the number of
tokens) was measured (one run, on a loaded machine; BENCHMARKS.md) and is not used: once warm,
fast-mode decode fell from 136-145 to 89 tok/s at one stream and from 412 to 359 at 16, and was
level at 64 (659 against 655); and the four groups share one wrapper whose recompile limit a
serving mix of batch sizes exhausted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from kernels import cpu_ops

# Rows up to which the native norm runs where its loops are scalar (a CPU without AVX-512 BW and
# VL). Measured with those loops (bench/native_ops.py, bfloat16, 576 wide; BENCHMARKS.md): at 64
# rows RMSNorm 22.9 us against torch's 39.8 and add and norm 38.7 against 44.0 on an AMD EPYC
# (Zen 4), 16.6 against 38.7 and 36.0 against 49.3 on an Intel Xeon with AMX; at 256 rows add and
# norm was slower on the Xeon (149.0 against 129.9), and at 512 on both. The vector loops were
# faster at every count measured, 1 to 512 rows (add and norm of 512 rows on that Xeon: 95.8 us
# against torch's 335.2). A product that comes back as a transposed view takes torch's norm.
SCALAR_NORM_ROWS = 64
# Rows up to which the native rope reads a transposed product in place, column by column;
# more were slower than torch's rope, which returns them dense.
NATIVE_ROPE_STRIDED_ROWS = 16


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in fp32 whatever the engine dtype, as the reference implementation does.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, 1, head_dim]. Rotate-half convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def add_norm(
    h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add, then the next RMSNorm: (h + y, norm(h + y))."""
    h = h + y
    return h, rms_norm(h, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True, slots=True)
class LayerOps:
    norm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    add_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]
    norm_rows: float = 0  # rows up to which the norms are the native ones (dense rows); 0: torch's


def native_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """In place, through ``x``'s strides (a view of the fused QKV product). Many rows of a
    transposed product take torch's rope, which returns them dense: read in place, column by
    column, they were slower than torch's rope, and a prefill's 512 rows took longer."""
    if x.stride(-1) != 1 and x.shape[0] > NATIVE_ROPE_STRIDED_ROWS:
        return apply_rope(x, cos, sin)
    return torch.ops.attest.rope_(x, cos, sin)


def native_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """One native pass with ``silu_mul``'s bits (torch's vector exp, the same roundings); a
    transposed product's view takes torch's."""
    if gate_up.dim() != 2 or gate_up.stride(-1) != 1:
        return silu_mul(gate_up)
    return torch.ops.attest.silu_mul(gate_up)


def norm_rows() -> float:
    """Rows up to which the native norms run: any number where their loops are vector ones,
    ``SCALAR_NORM_ROWS`` where they are scalar."""
    return math.inf if torch.ops.attest.rows_vectorised() else SCALAR_NORM_ROWS


def native_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, rows: float) -> torch.Tensor:
    if x.shape[0] > rows or x.stride(-1) != 1:
        return rms_norm(x, weight, eps)
    return torch.ops.attest.rms_norm(x, weight, eps)


def native_add_norm(
    h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, rows: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_norm`` with the sum written into ``h`` (the forward's own residual stream)."""
    if h.shape[0] > rows or y.stride(-1) != 1 or not h.is_contiguous():
        return add_norm(h, y, weight, eps)
    return h, torch.ops.attest.add_rms_norm(h, y, weight, eps)


def layer_ops(
    eps: float, dtype: torch.dtype = torch.float32, native: bool | None = None
) -> LayerOps:
    """The small ops for activations of ``dtype``; ``native`` None: where the native CPU ops
    are built (a CUDA model passes False)."""
    if native is None:
        native = cpu_ops.load()
    if not native:
        return LayerOps(
            partial(rms_norm, eps=eps), apply_rope, partial(add_norm, eps=eps), silu_mul
        )
    if dtype == torch.float32:  # exact mode: only what gives torch's bits
        return LayerOps(
            partial(rms_norm, eps=eps), native_rope, partial(add_norm, eps=eps), native_silu_mul
        )
    rows = norm_rows()
    return LayerOps(
        partial(native_norm, eps=eps, rows=rows),
        native_rope,
        partial(native_add_norm, eps=eps, rows=rows),
        native_silu_mul,
        rows,
    )
