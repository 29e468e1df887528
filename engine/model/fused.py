"""The small per-layer operations of the decoder, grouped as the forward uses them.

Between its matrix products a layer runs about twenty small operations (two RMSNorms, the
rotary embedding, SiLU times up, two residual adds), each a separate pass over a few kilobytes
with its own dispatch cost: at one decoding stream they take as long as the weights' products.
Grouped as ``norm``, ``rope``, ``add_norm`` (residual add, then the next norm) and
``silu_mul``, they run exactly the operations the reference implementation runs, in its
order, so exact mode keeps its tokens.

Compiling each group (``torch.compile``, inductor's C++ backend, dynamic in the number of
tokens) was measured (one run, on a loaded machine; BENCHMARKS.md) and is not used: once warm,
fast-mode decode fell from 136-145 to 89 tok/s at one stream and from 412 to 359 at 16, and was
level at 64 (659 against 655); and the four groups share one wrapper whose recompile limit a
serving mix of batch sizes exhausted.
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


def layer_ops(eps: float) -> LayerOps:
    return LayerOps(partial(rms_norm, eps=eps), apply_rope, partial(add_norm, eps=eps), silu_mul)
