"""Attest's serving engine.

Imports are lazy so that ``import engine.observability.schema`` never pulls torch in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["LLM", "SamplingParams", "EngineConfig", "RequestOutput"]

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.llm import LLM, RequestOutput
    from engine.model.sampling import SamplingParams


def __getattr__(name: str) -> Any:
    if name in ("LLM", "RequestOutput"):
        from engine import llm

        return getattr(llm, name)
    if name == "SamplingParams":
        from engine.model.sampling import SamplingParams

        return SamplingParams
    if name == "EngineConfig":
        from engine.config import EngineConfig

        return EngineConfig
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
