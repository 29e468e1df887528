"""Fakes the tests build the engine with (product code holds none of them)."""

from __future__ import annotations

from engine import LLM
from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.scheduler.group import GroupView


class SetFloor(GroupView):
    """A group view whose published floor the test sets (None: no floor published)."""

    def __init__(self, floor: int | None = None) -> None:
        self.floor = floor

    def published_floor(self) -> int | None:
        return self.floor


def llm_with_group(model_dir: str, group: GroupView, **config) -> LLM:
    """An ``LLM`` whose engine is built with ``group`` as its view of the group."""
    llm = LLM.__new__(LLM)
    llm.config = EngineConfig.from_kwargs(model=model_dir, **config)
    llm.core = EngineCore(llm.config, group=group)
    llm.tokenizer = llm.core.tokenizer
    return llm
