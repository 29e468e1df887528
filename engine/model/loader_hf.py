"""Load a Llama-family model from a Hugging Face folder: config.json + *.safetensors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.model.config import ModelConfig

_ARCHS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral"}


@dataclass(slots=True)
class HFContents:
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    raw_config: dict[str, Any]


def config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    archs = raw.get("architectures") or []
    arch = next((_ARCHS[a] for a in archs if a in _ARCHS), None)
    if arch is None:
        raise ValueError(
            f"config.json architectures {archs} are not supported; supported: {sorted(_ARCHS)}"
        )
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    # transformers 5 moved rope_theta into rope_parameters; read both spellings.
    rope_params = raw.get("rope_parameters") or {}
    theta = raw.get("rope_theta", rope_params.get("rope_theta", 10000.0))
    scaling = raw.get("rope_scaling") or None
    if scaling is None and rope_params.get("rope_type", "default") != "default":
        scaling = dict(rope_params)
    return ModelConfig(
        architecture=arch,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        max_position=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope_scaling=scaling,
        name=str(raw.get("_name_or_path", "")),
    )


def load_hf(folder: str | Path) -> HFContents:
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json")
    raw = json.loads(cfg_path.read_text())
    cfg = config_from_hf(raw)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            weights[name] = t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
    return HFContents(config=cfg, weights=weights, raw_config=raw)
