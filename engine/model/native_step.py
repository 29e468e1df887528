"""One native call for all the layers of a small decode forward (fast mode).

At one decoding stream a fast-mode step runs about fifteen operations a layer (the four packed
products, the rotary embedding, decode attention, two residual add-and-norms, SiLU times up, and
the views between them), each a few microseconds of Python and dispatch around a kernel of tens
of microseconds: a tenth or more of the step. ``torch.ops.attest.decode_layers``
(``kernels/cpu_step.cpp``) runs the same kernels in the same order for every layer in one call,
so its result has the Python forward's bits (``tests/unit/test_native_step.py`` compares them).

It takes a forward when every one of these holds, else the Python layers run:

* fast mode with its packed kernels (``small_rows`` > 0: a CPU with bfloat16 units), every layer
  matrix in a packed int8 or int4 form, torch's or the native integer products' of
  ``engine.model.int_vnni`` (not FBGEMM's integer product, which has its own quantisation step in
  Python);
* the native CPU ops are built for this CPU and the attention backend is the torch reference's
  native decode path (the kernel the call runs);
* one rank and one pipeline stage (no collective between the products);
* at most ``rows`` tokens in the forward (``STEP_ROWS``, the packed kernels' least bound; a
  bound fixed lower by ``ATTEST_INT_ROWS`` turns the call off).

Exact mode keeps its Python layers: its products are float32 GEMMs whose one-row orientation
(``engine.model.llama.linear``) and torch's norm are what give transformers' bits, and at one
stream they take most of its step, not the dispatch between them.
``ATTEST_NATIVE_STEP=0`` in the environment turns it off (to measure against, or to rule it out);
``boot.weights`` says whether it runs (``step_rows``).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import torch

from engine.group.comm import Comm
from engine.group.pipeline import Stage
from engine.model.config import ModelConfig
from engine.model.quant import SMALL_ROWS, QuantPlan, QuantWeight
from kernels import cpu_ops
from kernels.attention import AttentionBackend, AttentionMetadata, LayerKV
from kernels.paged_decode import native_slots

STEP_ROWS = SMALL_ROWS
MATRICES = ("qkv", "o", "gate_up", "down")  # a layer's linear matrices, in their order


class Stepped(Protocol):
    """What the native call reads of a model (``LlamaModel``, which builds its ``NativeStep``
    and so cannot be imported here)."""

    cfg: ModelConfig
    quant: QuantPlan | None
    device: torch.device
    backend: AttentionBackend
    comm: Comm
    stage: Stage
    layers: list[dict[str, Any]]  # a layer's weights by name: tensors, quantised matrices
    next_norms: list[torch.Tensor]  # the norm each layer's last residual add feeds
    local_heads: int
    local_kv_heads: int
    scale: float


def why_not(model: Stepped) -> str | None:
    """Why ``model``'s (a ``LlamaModel``'s) small decode forwards run layer by layer in Python
    (None: they can run as one native call)."""
    if os.environ.get("ATTEST_NATIVE_STEP", "").strip() == "0":
        return "turned off (ATTEST_NATIVE_STEP=0)"
    if model.quant is None or not model.quant.small_rows:
        return "not fast mode with packed kernels"
    if model.quant.small_rows < STEP_ROWS:  # fixed by ATTEST_INT_ROWS
        return f"the packed kernels' bound ({model.quant.small_rows} rows) is under its {STEP_ROWS}"
    if model.device.type != "cpu" or not cpu_ops.load():
        return f"native CPU ops not in use: {cpu_ops.why_not() or 'not a CPU'}"
    if getattr(model.backend, "decode", None) != "native":
        return "the attention backend is not the native decode path"
    if model.comm.world > 1 or model.stage.count > 1:
        return "more than one rank or stage"
    for layer in model.layers:
        if any(
            not isinstance(layer[k], QuantWeight) or layer[k].packed_form() is None
            for k in MATRICES
        ):
            return "a layer matrix has no packed int8/int4 form"
    return None


class NativeStep:
    """A model's layers as the native call takes them: built once at load."""

    def __init__(self, model: Stepped) -> None:
        forms = [layer[k].packed_form() for layer in model.layers for k in MATRICES]
        self.mats = [f[0] for f in forms]
        self.scales = [f[1] for f in forms]
        self.groups = [f[2] for f in forms]
        self.norms = [
            n
            for layer, nxt in zip(model.layers, model.next_norms)
            for n in (layer["mlp_norm"], nxt)
        ]
        self.dims = [model.local_heads, model.local_kv_heads, model.cfg.head_dim]
        self.scale, self.eps = model.scale, model.cfg.rms_eps
        self.rows = STEP_ROWS

    @classmethod
    def build(cls, model: Stepped) -> NativeStep | None:
        return cls(model) if why_not(model) is None else None

    def __call__(
        self,
        h: torch.Tensor,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        kv_layers: list[LayerKV],
    ) -> torch.Tensor:
        """The layers' output for ``x`` (the first layer's normed input), ``h`` the residual
        stream (updated in place); the same slot plan as the native attention's."""
        slots, lens = native_slots(meta)
        pools = [t for kv in kv_layers for t in (kv.k, kv.v)]
        return torch.ops.attest.decode_layers(
            h,
            x,
            cos,
            sin,
            self.mats,
            self.scales,
            self.groups,
            self.norms,
            pools,
            meta.out_slots,
            slots,
            lens,
            self.dims,
            self.scale,
            self.eps,
        )
