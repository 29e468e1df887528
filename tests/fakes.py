"""Fakes the tests build the engine with (product code holds none of them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from engine import LLM
from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.scheduler.group import GroupView

T = TypeVar("T")


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


class Charged:
    """A measure's clock, advanced only by what a slowed call is charged: the real products
    take no time on it, so a choice between two ways never races how busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def slowed(
        self, fn: Callable[..., T], by: float | Callable[..., float] = 0.02
    ) -> Callable[..., T]:
        """``fn``, each call charged ``by`` seconds (or ``by(*args)``) on this clock."""

        def call(*a: object) -> T:
            self.now += by(*a) if callable(by) else by
            return fn(*a)

        return call
