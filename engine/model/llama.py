"""A Llama-family decoder in torch: RMSNorm, RoPE (plain, linear, llama3), GQA, SwiGLU.

Weights arrive as a dict in Hugging Face's names (``model.layers.N.self_attn.q_proj.weight``);
every loader maps its format to those names, so this module is the only one that knows the
architecture. Q/K/V and gate/up are fused into one matrix each: two GEMMs instead of five.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from engine.group.comm import Comm
from engine.group.pipeline import Stage, stage_layers
from engine.model.config import ModelConfig
from engine.model.fused import layer_ops
from engine.model.int_rows import widen
from engine.model.native_step import MATRICES, NativeStep
from engine.model.orient import (
    HEAD_ROWS,
    Orientation,
    by_mm,
    by_rows,
    choose,
    gated_linear,
    on_f32,
    on_pairs,
    on_tiles,
    pack,
    packed_linear,
)
from engine.model.quant import QuantPlan, QuantWeight, quantize_weight
from engine.model.shard import cols, plan_shard, rows, vocab_rows
from kernels.attention import AttentionBackend, AttentionMetadata, LayerKV

GATED = tuple(k == "gate_up" for k in MATRICES)  # the layer matrices laid out gated (packed)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies for the rotary embedding, with the config's scaling applied."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return inv
    if kind == "linear":
        return inv / float(rs["factor"])
    if kind == "llama3":
        factor = float(rs["factor"])
        low = float(rs.get("low_freq_factor", 1.0))
        high = float(rs.get("high_freq_factor", 4.0))
        old_ctx = float(rs.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    if kind == "freq_factors":  # llama.cpp stores llama3 scaling as per-frequency divisors
        return inv / torch.as_tensor(rs["factors"], dtype=torch.float32)
    raise ValueError(f"unsupported rope scaling type {kind!r}")


def linear(
    x: torch.Tensor,
    w: torch.Tensor | QuantWeight,
    orient: Orientation | None = None,
    packed: torch.Tensor | None = None,
    silu_mul: Callable[[torch.Tensor], torch.Tensor] | None = None,
    widen: bool = False,
) -> torch.Tensor:
    """``x @ w.T``. A quantised matrix (fast mode) takes its packed kernel for a few rows, its dense
    values beyond (with their own packed copy, ``QuantWeight.dense_packed``). A dense product runs
    the way ``orient`` says, measured at load for this CPU (``engine.model.orient``:
    ``F.linear``, ``(w @ x.T).T``, or oneDNN on ``packed``, ``w`` laid out once). Unmeasured (a
    GPU): float32 as ``(w @ x.T).T``, bfloat16 one row by the plain call and more as
    ``(w @ x.T).T``. With ``silu_mul`` (``w`` a gate/up matrix, ``packed`` laid out gated):
    ``silu_mul`` of the product, in the product's own pass where the packed copy is on the
    tiles (``orient.gated_linear``). ``widen``: float32 out where the packed product can store
    it so (``orient.packed_linear``; the LM head's logits, which are kept in float32).
    """
    if isinstance(w, QuantWeight):
        if x.shape[0] <= w.small_rows:
            y = w.packed_matmul(x)
            return y if silu_mul is None else silu_mul(y)
        w, packed = w.dense, w.dense_packed
    if orient is not None and packed is not None and orient.takes_packed(x.shape[0]):
        if silu_mul is not None:
            return gated_linear(x, packed, silu_mul)
        return packed_linear(x, packed, widen)
    y = _unpacked(x, w, orient)
    return y if silu_mul is None else silu_mul(y)


def _unpacked(x: torch.Tensor, w: torch.Tensor, orient: Orientation | None) -> torch.Tensor:
    """``x @ w.T`` by ``F.linear`` or ``(w @ x.T).T``, as ``linear`` takes them."""
    if orient is not None:
        return by_rows(x, w) if orient.takes_mm(x.shape[0]) else F.linear(x, w)
    if w.dtype != torch.float32:
        return F.linear(x, w) if x.shape[0] == 1 else torch.mm(w, x.t()).t()
    return by_mm(x, w)


class LlamaModel:
    """The decoder, or with ``comm.world > 1`` one tensor-parallel rank's shard of it
    (``engine.model.shard``): its query and KV heads, its slice of the MLP and of the
    vocabulary. ``o_proj``, ``down_proj`` and the embedding end in one all-reduce each, the
    LM head in an all-gather, so ``forward`` and ``logits`` return the whole model's numbers on
    every rank. The KV pool of a rank holds ``local_kv_heads`` heads."""

    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        backend: AttentionBackend,
        device: str | torch.device = "cpu",
        *,
        comm: Comm | None = None,
        quant: QuantPlan | None = None,
        stage: Stage | None = None,
    ) -> None:
        self.cfg = cfg
        self.stage = stage if stage is not None else Stage()
        self.span = stage_layers(cfg.num_layers, self.stage.count, self.stage.index)
        self.quant = quant  # fast mode: linear layers quantised (engine.model.quant)
        self.dtype = dtype
        self.backend = backend
        self.device = torch.device(device)
        # the small ops between the products: native where built, on a CPU
        cpu = self.device.type == "cpu"
        self.ops = layer_ops(cfg.rms_eps, dtype, native=None if cpu else False)
        self.comm = comm if comm is not None else Comm()
        self.shard = plan_shard(
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.intermediate_size,
            cfg.vocab_size,
            self.comm.world,
            self.comm.rank,
        )
        self.local_heads = len(self.shard.heads)
        self.local_kv_heads = len(self.shard.kv_heads)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self._take_weights(dict(weights))
        self.inv_freq = rope_inv_freq(cfg).to(self.device)
        self.q_size = self.local_heads * cfg.head_dim
        self.kv_size = self.local_kv_heads * cfg.head_dim
        self.packed_bytes = 0  # the packed copies' (``_orientations``)
        self.packed_tiles = False  # whether they are laid out for AMX's tiles (``orient.pack``)
        self.packed_f32 = False  # ... or for the native float32 product
        self.packed_pairs = False  # ... or for the native bfloat16 product on vectors
        self.head_packed: torch.Tensor | None = None
        self.orient, self.head_orient = self._orientations()
        # fast mode: up to how many rows the layers' integer products run, on this CPU
        widen(self, MATRICES, lambda x, w: linear(x, w.dense, self.orient, w.dense_packed))
        # a small decode forward's layers in one native call, where it runs (fast mode)
        self.native_step = NativeStep.build(self)

    def _take_weights(self, w: dict[str, torch.Tensor]) -> None:
        """This rank's part of the weights ``w`` (in Hugging Face's names): its stage's layers
        (their shard), the embedding on the first stage, the final norm and LM head on the last;
        any weight no stage takes is an error."""
        cfg = self.cfg

        def take(name: str) -> torch.Tensor:
            if name not in w:
                raise KeyError(f"missing weight {name!r}")
            return w.pop(name)

        embed = take("model.embed_tokens.weight")
        if embed.shape != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(
                f"model.embed_tokens.weight has shape {tuple(embed.shape)}, "
                f"config says ({cfg.vocab_size}, {cfg.hidden_size})"
            )
        first, last = self.stage.first, self.stage.last
        self.embed = self._put(vocab_rows(embed, self.shard.vocab)) if first else None
        self.layers = [self._layer(take, f"model.layers.{i}.") for i in self.span]
        # the norm each layer's last residual add feeds: the next layer's (the next stage's
        # first, on a stage before the last), then the final one
        final = take("model.norm.weight")
        boundary = f"model.layers.{self.span.stop}.input_layernorm.weight"
        self.norm = self._put(final if last else w[boundary])
        self.next_norms = [layer["attn_norm"] for layer in self.layers[1:]] + [self.norm]
        head = take("lm_head.weight") if "lm_head.weight" in w else None
        self.lm_head = self._lm_head(head, embed) if last else None
        for name in [k for k in w if k.startswith("model.layers.")]:  # other stages' layers
            if int(name.split(".")[2]) not in self.span:
                del w[name]
        leftover = sorted(k for k in w if "rotary_emb" not in k)
        if leftover:
            raise ValueError(
                f"unexpected weights: {leftover[:5]}{' ...' if len(leftover) > 5 else ''}"
            )

    def _lm_head(
        self, head: torch.Tensor | None, embed: torch.Tensor
    ) -> torch.Tensor | QuantWeight:
        """The file's LM head, else the tied embeddings (the model's own table, or in fast mode
        an int8 copy: the lookup keeps the dense table, the product its own)."""
        if head is not None:
            head = vocab_rows(head, self.shard.vocab)
            return self._mat(head, mode="int8") if self.quant else self._put(head)
        if not self.cfg.tie_word_embeddings:
            raise KeyError("missing weight 'lm_head.weight' and embeddings are not tied")
        if self.quant is None:  # the lookup's own table, on a stage that has it
            return (
                self.embed
                if self.embed is not None
                else self._put(vocab_rows(embed, self.shard.vocab))
            )
        return self._mat(vocab_rows(embed, self.shard.vocab), mode="int8")

    def _orientations(self) -> tuple[Orientation | None, Orientation | None]:
        """The way dense products run on this CPU, for the layers and the LM head, measured
        (``engine.model.orient``); None on a GPU. The packed way is measured too, and a part some
        bucket of which takes it keeps its matrices packed beside them (exact mode's layers in
        each layer's ``"packed"``, its head in ``head_packed``; fast mode's dense values in
        their ``QuantWeight.dense_packed``). Fast mode's bound (``int_rows``) is measured after,
        against the dense way chosen here."""
        if self.device.type != "cpu":
            return None, None
        dense = lambda m: m.dense if isinstance(m, QuantWeight) else m  # noqa: E731
        layers = head = None
        if self.layers:
            packs = self._packs([dense(self.layers[0][k]) for k in MATRICES], GATED)
            layers = choose([dense(self.layers[0][k]) for k in MATRICES], packs=packs)
            for i, layer in enumerate(self.layers if layers.uses_packed else []):
                got = packs if i == 0 else self._packs([dense(layer[k]) for k in MATRICES], GATED)
                for k, p in zip(MATRICES, got or ()):
                    if (beside := self._keep(layer[k], p)) is not None:
                        layer.setdefault("packed", {})[k] = beside
        if self.lm_head is not None:
            packs = self._packs([dense(self.lm_head)], (False,))
            head = choose([dense(self.lm_head)], HEAD_ROWS, packs)
            if packs is not None and head.uses_packed:
                self.head_packed = self._keep(self.lm_head, packs[0])
        return layers, head

    def _keep(self, mat: torch.Tensor | QuantWeight, packed: torch.Tensor) -> torch.Tensor | None:
        """``mat``'s packed copy, counted in ``packed_bytes``: kept on a quantised matrix's dense
        values (None returned), else returned to be kept beside the matrix."""
        self.packed_bytes += packed.numel() * packed.element_size()
        self.packed_tiles = on_tiles(packed)
        self.packed_f32 = on_f32(packed)
        self.packed_pairs = on_pairs(packed)
        if isinstance(mat, QuantWeight):
            mat.dense_packed = packed
            return None
        return packed

    def _packs(
        self, mats: list[torch.Tensor], gated: tuple[bool, ...]
    ) -> list[torch.Tensor] | None:
        """``mats`` packed (``orient.pack``: for AMX's tiles or for oneDNN; each one ``gated``
        says is a gate/up matrix, laid out gated), where each packs; None: the products are
        measured without the packed way."""
        packs = [pack(m, g) for m, g in zip(mats, gated, strict=True)]
        return None if any(p is None for p in packs) else packs  # type: ignore[return-value]

    def _put(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's slice, cast and moved: the rest of a weight never reaches the device.
        A column slice is strided; the matrix products want it dense (a no-op at one rank)."""
        return t.to(device=self.device, dtype=self.dtype).contiguous()

    def _mat(self, *parts: torch.Tensor, mode: str | None = None) -> torch.Tensor | QuantWeight:
        """A linear layer's matrix (``parts`` fused by output rows): cast and moved, or in fast
        mode quantised from the file's values (the LM head int8 in both modes: ``mode``)."""
        if self.quant is None:
            return torch.cat([self._put(p) for p in parts], 0).contiguous()
        w = torch.cat([p.float() for p in parts], 0).contiguous()
        return quantize_weight(w, self.quant, mode)

    def _layer(self, take: Callable[[str], torch.Tensor], p: str) -> dict[str, Any]:
        """Layer ``p``'s weights: QKV and gate/up fused and cut by output rows (gate's rows,
        then up's, so ``chunk(2)`` still splits them), ``o`` and ``down`` by input columns."""
        sh, hd = self.shard, self.cfg.head_dim
        q = rows(take(p + "self_attn.q_proj.weight"), sh.heads, hd)
        k = rows(take(p + "self_attn.k_proj.weight"), sh.kv_heads, hd)
        v = rows(take(p + "self_attn.v_proj.weight"), sh.kv_heads, hd)
        gate = rows(take(p + "mlp.gate_proj.weight"), sh.inter)
        up = rows(take(p + "mlp.up_proj.weight"), sh.inter)
        return {
            "attn_norm": self._put(take(p + "input_layernorm.weight")),
            "qkv": self._mat(q, k, v),
            "o": self._mat(cols(take(p + "self_attn.o_proj.weight"), sh.heads, hd)),
            "mlp_norm": self._put(take(p + "post_attention_layernorm.weight")),
            "gate_up": self._mat(gate, up),
            "down": self._mat(cols(take(p + "mlp.down_proj.weight"), sh.inter)),
        }

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> [T, hidden]. A rank looks up the ids in its vocabulary rows, the others give
        zeros, and the sum over the ranks is each id's one row."""
        if self.comm.world == 1:
            return F.embedding(input_ids, self.embed)
        local = input_ids - self.shard.vocab.start
        mine = (local >= 0) & (local < len(self.shard.vocab))
        h = F.embedding(torch.where(mine, local, 0), self.embed)
        return self.comm.all_reduce_sum(h.masked_fill_(~mine.unsqueeze(-1), 0))

    def rope_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        meta: AttentionMetadata,
        kv_layers: list[LayerKV],
    ) -> torch.Tensor:  # [T, hidden]
        cfg, stage = self.cfg, self.stage
        T = input_ids.shape[0]
        cos, sin = self.rope_cos_sin(meta.positions)
        ops, heads, kv_heads = self.ops, self.local_heads, self.local_kv_heads
        if stage.first:
            h = self.embed_tokens(input_ids)
            x = ops.norm(h, self.layers[0]["attn_norm"])
        else:  # the residual stream and the next norm's output, from the stage before
            h, x = stage.recv((T, cfg.hidden_size), self.dtype, 2)
        if self.native_step is not None and self.native_step.takes(meta):
            return self.native_step(h, x, cos, sin, meta, kv_layers)  # the same bits
        for layer, kv, next_norm in zip(self.layers, kv_layers, self.next_norms):
            pk = layer.get("packed", {})
            qkv = linear(x, layer["qkv"], self.orient, pk.get("qkv"))
            qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
            # Q's and K's heads rotated in one pass (elementwise: the same numbers as two)
            qk = ops.rope(qk.reshape(T, heads + kv_heads, -1), cos, sin)
            q, k = qk.split([heads, kv_heads], dim=1)
            v = v.reshape(T, kv_heads, cfg.head_dim)
            attn = self.backend.forward(q, k, v, kv, meta, self.scale)
            # row-parallel: each rank's partial product, summed before the residual
            o = linear(attn.reshape(T, self.q_size), layer["o"], self.orient, pk.get("o"))
            o = self.comm.all_reduce_sum(o)
            h, x = ops.add_norm(h, o, layer["mlp_norm"])
            act = linear(x, layer["gate_up"], self.orient, pk.get("gate_up"), ops.silu_mul)
            down = linear(act, layer["down"], self.orient, pk.get("down"))
            down = self.comm.all_reduce_sum(down)
            h, x = ops.add_norm(h, down, next_norm)
        if not stage.last:
            stage.send([h, x])
        return x  # on the last stage, the last add_norm applied the final norm

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] in fp32 on every rank: each rank's vocabulary columns,
        gathered in rank order, the padding past the vocabulary cut off; computed on the last
        stage and shared with the others (whose ``hidden`` only says N)."""
        out = None
        if self.stage.last:
            # float32 from the product itself where it can (then .float() is no copy); across
            # ranks the bfloat16 columns are gathered, half the bytes
            widen = self.comm.world == 1
            out = linear(hidden, self.lm_head, self.head_orient, self.head_packed, widen=widen)
            full = self.comm.all_gather(out, dim=-1)
            out = full[:, : self.cfg.vocab_size].float()
        return self.stage.share(out, (hidden.shape[0], self.cfg.vocab_size))
