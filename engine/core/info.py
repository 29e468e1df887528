"""What ``engine info`` prints of an engine, and the scheduler process sends the frontend."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from engine.config import EngineConfig
from engine.memory.allocator import TokenAllocator
from engine.memory.kv_pool import KVPool, PoolSizing
from engine.model.config import ModelConfig
from engine.model.llama import LlamaModel
from engine.model.loader import LoadedModel
from engine.model.quant import QuantPlan
from engine.request.messages import EngineInfo
from engine.scheduler.scheduler import Scheduler


class Described(Protocol):
    """What the description reads of an engine (``EngineCore``, which describes itself with
    it and so cannot be imported here)."""

    config: EngineConfig
    loaded: LoadedModel
    model_config: ModelConfig
    model: LlamaModel
    quant: QuantPlan | None
    dtype: torch.dtype
    max_context: int
    sizing: PoolSizing
    allocator: TokenAllocator
    kv: KVPool
    scheduler: Scheduler
    startup_seconds: float
    store_off: str | None

    def weights_fields(self) -> dict[str, Any]: ...


def engine_info(core: Described) -> EngineInfo:
    """``core``'s description (an ``EngineCore``): what ``engine info`` prints and the
    scheduler process sends the frontend at boot."""
    cfg, weights = core.model_config, core.weights_fields()
    return EngineInfo(
        model=core.loaded.path,
        format=core.loaded.format,
        name=cfg.name,
        architecture=cfg.architecture,
        parameters=cfg.parameter_count(),
        layers=cfg.num_layers,
        hidden=cfg.hidden_size,
        heads=cfg.num_heads,
        kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        vocab=cfg.vocab_size,
        context=core.max_context,
        dtype=str(core.dtype).removeprefix("torch."),
        kv_tokens=core.scheduler.memory.capacity,  # the group's: its smallest rank's
        kv_sizing=core.sizing.path,
        page_size=core.allocator.page_size,
        kv_bytes_per_token=core.kv.bytes_per_token,
        kv_pool_bytes=core.kv.total_bytes,
        attention_backend=core.model.backend.name,
        device=core.config.model.device,
        load_seconds=round(core.loaded.load_seconds, 2),
        startup_seconds=round(core.startup_seconds, 2),
        tp=core.config.group.tp,
        pp=core.config.group.pp,
        weights=weights["mode"],
        weights_path=core.quant.path if core.quant else "",
        ops=" ".join(x for x in (weights.get("ops", ""), weights.get("ops_why") or "") if x),
        store_off=core.store_off,
    )
