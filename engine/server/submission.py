"""What the frontend hands the driver for one request, and the error a dying scheduler raises."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class Submission:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    arrived: float | None = None  # the wall time the HTTP request came in


class SchedulerDied(RuntimeError):
    """The scheduler process said it is dying (``Dead``): the whole text, and ``said``."""

    def __init__(self, reason: str, said: str) -> None:
        super().__init__(reason)
        self.said = said
