"""The small per-layer operations of the decoder, grouped as the forward uses them, eager or
compiled.

Between its matrix products a layer runs about twenty small operations (two RMSNorms, the
rotary embedding, SiLU times up, two residual adds), each a separate pass over a few kilobytes
with its own dispatch cost: at one decoding stream they take as long as the weights' products.
Grouped as ``norm``, ``rope``, ``add_norm`` (residual add, then the next norm) and
``silu_mul``, each group can be one compiled kernel (``torch.compile``, inductor's C++ backend,
dynamic in the number of tokens). Eager, the groups run exactly the operations the reference
implementation runs, in its order; compiled, inductor may fuse and reorder the arithmetic, so
the compiled groups are for fast mode, and exact mode's token identity is kept by running them
eager there unless asked (see ``engine.config.EngineConfig.compile``).

Inductor keeps what it compiled in its cache (``TORCHINDUCTOR_CACHE_DIR``, by default under the
system's temporary folder), so a warm boot loads the kernels instead of compiling them again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F


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
    compiled: bool


def layer_ops(eps: float, compiled: bool) -> LayerOps:
    fns = (partial(rms_norm, eps=eps), apply_rope, partial(add_norm, eps=eps), silu_mul)
    if compiled:
        fns = tuple(torch.compile(f, dynamic=True, fullgraph=True) for f in fns)
    return LayerOps(*fns, compiled=compiled)
