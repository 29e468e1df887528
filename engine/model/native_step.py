"""One native call for all the layers of a decode forward (fast mode and exact mode).

At one decoding stream a step runs about fifteen operations a layer (the four products, the
rotary embedding, decode attention, two residual add-and-norms, SiLU times up, and the views
between them), each a few microseconds of Python and dispatch around a kernel of tens of
microseconds: a tenth or more of a fast-mode step. ``torch.ops.attest.decode_layers`` (fast
mode's packed products, up to the rows they take) and ``dense_layers`` (dense products: exact
mode's, and fast mode's dense values past those rows; each the way ``linear`` takes it at these
rows: ``F.linear``, ``(W @ x.T).T`` or oneDNN on weights packed at load) (``kernels/cpu_step.cpp``)
run the same kernels in the same order for every layer in one call, so the result has the Python
forward's bits (``tests/unit/test_native_step.py`` compares them). Where the Python layers take
torch's add and norm (exact mode in float32, whose tokens are transformers'; bfloat16 past the
native norms' rows, ``LayerOps.norm_rows``) the call runs the same torch ops.

It takes a forward when every one of these holds, else the Python layers run:

* fast mode with its packed kernels (``small_rows`` > 0: a CPU with bfloat16 units), every layer
  matrix in a packed int8 or int4 form, torch's or the native integer products' of
  ``engine.model.int_vnni`` (not FBGEMM's integer product, which has its own quantisation step in
  Python), all with the plan's bound; or exact mode, its dense products' ways measured at load;
* the native CPU ops are built for this CPU and the attention backend is the torch reference's
  native decode path (the kernel the call runs), and every request of the forward brings at
  most ``SHORT_EXTEND`` tokens (what that path attends as rows: a decode, drafts);
* one rank and one pipeline stage (no collective between the products);
* at most ``rows`` tokens in the forward (``DENSE_STEP_ROWS`` where the dense products' ways were
  measured at load, as on a CPU they are; else fast mode's bound, ``small_rows``).

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
from engine.model.fused import LayerOps
from engine.model.orient import Orientation
from engine.model.quant import QuantPlan, QuantWeight
from kernels import cpu_ops
from kernels.attention import AttentionBackend, AttentionMetadata, LayerKV
from kernels.paged_decode import native_slots
from kernels.torch_ref import as_rows

# the bound with dense products: a decode batch of up to this many requests (the default
# max_running is 64); chosen, not measured: past it the Python layers run
DENSE_STEP_ROWS = 256
MATRICES = ("qkv", "o", "gate_up", "down")  # a layer's linear matrices, in their order


class Stepped(Protocol):
    """What the native call reads of a model (``LlamaModel``, which builds its ``NativeStep``
    and so cannot be imported here)."""

    cfg: ModelConfig
    ops: LayerOps
    # the dense products' ways (fast mode: its dense values'), measured at load
    orient: Orientation | None
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
    if model.quant is not None and not model.quant.small_rows:
        return "not fast mode with packed kernels"
    if model.device.type != "cpu" or not cpu_ops.load():
        return f"native CPU ops not in use: {cpu_ops.why_not() or 'not a CPU'}"
    if getattr(model.backend, "decode", None) != "native":
        return "the attention backend is not the native decode path"
    if model.comm.world > 1 or model.stage.count > 1:
        return "more than one rank or stage"
    mats = [layer[k] for layer in model.layers for k in MATRICES]
    if model.quant is not None:
        if any(not isinstance(w, QuantWeight) or w.packed_form() is None for w in mats):
            return "a layer matrix has no packed int8/int4 form"
        if any(w.small_rows != model.quant.small_rows for w in mats):
            return "the layer matrices' packed products take different rows"
    if model.orient is None:
        return None if model.quant is not None else "the dense products' ways were not measured"
    if model.orient.uses_packed and any(p is None for p in _dense(model)[1]):
        return "a layer matrix has no packed copy"
    return None


def _dense(model: Stepped) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """The layer matrices' dense values and their packed copies (None: not packed), in order:
    exact mode's weights, or fast mode's dequantised values."""
    if model.quant is None:
        pairs = [
            (layer[k], layer.get("packed", {}).get(k)) for layer in model.layers for k in MATRICES
        ]
    else:
        pairs = [
            (layer[k].dense, layer[k].dense_packed) for layer in model.layers for k in MATRICES
        ]
    return [d for d, _ in pairs], [p for _, p in pairs]


class NativeStep:
    """A model's layers as the native call takes them: built once at load."""

    def __init__(self, model: Stepped) -> None:
        self.norms = [
            n
            for layer, nxt in zip(model.layers, model.next_norms)
            for n in (layer["mlp_norm"], nxt)
        ]
        self.dims = [model.local_heads, model.local_kv_heads, model.cfg.head_dim]
        self.scale, self.eps = model.scale, model.cfg.rms_eps
        # up to int_rows rows, fast mode's packed products (decode_layers); past them the dense
        # products the way orient says (dense_layers), where it was measured
        self.int_rows = 0
        if model.quant is not None:
            forms = [layer[k].packed_form() for layer in model.layers for k in MATRICES]
            self.mats = [f[0] for f in forms]
            self.scales = [f[1] for f in forms]
            self.groups = [f[2] for f in forms]
            self.int_rows = model.quant.small_rows
        self.orient = model.orient
        self.dense, self.packed = _dense(model)
        self.norm_rows = model.ops.norm_rows  # the native norms' rows; past them torch's
        self.rows = DENSE_STEP_ROWS if self.orient is not None else self.int_rows

    @classmethod
    def build(cls, model: Stepped) -> NativeStep | None:
        return cls(model) if why_not(model) is None else None

    def takes(self, meta: AttentionMetadata) -> bool:
        """Whether this forward runs as the one call: at most ``rows`` tokens, each request
        bringing at most ``SHORT_EXTEND`` (the rows the native decode path attends)."""
        return meta.num_tokens <= self.rows and as_rows(meta)

    def way(self, rows: int) -> int:
        """The way ``linear`` takes a dense product of ``rows`` rows, as ``dense_layers``
        numbers them (0 ``F.linear``, 1 ``(W @ x.T).T``, 2 oneDNN on the packed copy)."""
        assert self.orient is not None
        if self.orient.takes_packed(rows):
            return 2
        return 1 if self.orient.takes_mm(rows) else 0

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
        tail = (self.norms, pools, meta.out_slots, slots, lens, self.dims, self.scale, self.eps)
        if x.shape[0] <= self.int_rows:
            return torch.ops.attest.decode_layers(
                h, x, cos, sin, self.mats, self.scales, self.groups, *tail
            )
        way = self.way(x.shape[0])
        mats = self.packed if way == 2 else self.dense
        native_norm = x.shape[0] <= self.norm_rows
        return torch.ops.attest.dense_layers(h, x, cos, sin, mats, way, native_norm, *tail)
