"""Load a Llama-family model from a GGUF file: config from metadata, tensors dequantized.

GGUF (as written by llama.cpp's converter) permutes the rows of the Q and K projections so that
rotary pairs are interleaved; our decoder uses Hugging Face's rotate-half layout, so the
permutation is undone here, once, at load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.model.config import SUPPORTED_ARCHITECTURES, ModelConfig

# Quant types we dequantize (through the gguf package's reference numpy code).
SUPPORTED_QUANTS = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)

_LAYER_MAP = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")


@dataclass(slots=True)
class GGUFContents:
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    metadata: dict[str, Any]  # every key/value field, decoded (tokenizer arrays included)


def read_metadata(reader: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = field.contents()
    return meta


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of rotary pairs in the rows of a Q or K projection."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does (used by tests that write GGUF files)."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config_from_metadata(meta: dict[str, Any]) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )

    def get(key: str, default: Any = None) -> Any:
        full = f"{arch}.{key}"
        if full in meta:
            return meta[full]
        if default is None:
            raise ValueError(f"GGUF metadata lacks {full!r}")
        return default

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    kv_heads = int(get("attention.head_count_kv", heads))
    head_dim = int(get("attention.key_length", hidden // heads))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    rope_scaling = None
    scaling_type = meta.get(f"{arch}.rope.scaling.type")
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    elif scaling_type not in (None, "none"):
        raise ValueError(f"unsupported GGUF rope scaling type {scaling_type!r}")
    return ModelConfig(
        architecture="llama",
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position=int(get("context_length", 2048)),
        tie_word_embeddings=True,  # corrected below when an output tensor exists
        rope_scaling=rope_scaling,
        name=str(meta.get("general.name", "")),
    )


def dequantize_tensor(t: Any) -> np.ndarray:
    """One GGUF tensor as float32 [rows, cols] (or [n] for vectors)."""
    from gguf import quants

    qname = t.tensor_type.name
    if qname not in SUPPORTED_QUANTS:
        raise ValueError(
            f"tensor {t.name!r} has quant type {qname}, which this loader does not dequantize; "
            f"supported: {', '.join(SUPPORTED_QUANTS)}"
        )
    arr = quants.dequantize(t.data, t.tensor_type)
    # GGUF lists dims fastest-first; numpy wants them slowest-first.
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    out = np.ascontiguousarray(arr.reshape(shape), dtype=np.float32)
    # F32 tensors come back as read-only views of the memory-mapped file.
    return out if out.flags.writeable else out.copy()


def load_gguf(path: str) -> GGUFContents:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    meta = read_metadata(reader)
    cfg = config_from_metadata(meta)
    weights: dict[str, torch.Tensor] = {}
    rope_factors = None
    for t in reader.tensors:
        name = str(t.name)
        if name == "rope_freqs.weight":
            rope_factors = dequantize_tensor(t)
            continue
        m = _BLK.match(name)
        if m and m.group(2) in _LAYER_MAP:
            hf = f"model.layers.{m.group(1)}.{_LAYER_MAP[m.group(2)]}.weight"
        elif name in _TOP_MAP:
            hf = _TOP_MAP[name]
        else:
            raise ValueError(f"tensor {name!r} is not part of a llama model this loader knows")
        arr = dequantize_tensor(t)
        if m and m.group(2) == "attn_q":
            arr = unpermute_qk(arr, cfg.num_heads)
        elif m and m.group(2) == "attn_k":
            arr = unpermute_qk(arr, cfg.num_kv_heads)
        weights[hf] = torch.from_numpy(arr)
    cfg.tie_word_embeddings = "lm_head.weight" not in weights
    if rope_factors is not None:
        cfg.rope_scaling = {"rope_type": "freq_factors", "factors": rope_factors.tolist()}
    return GGUFContents(config=cfg, weights=weights, metadata=meta)
