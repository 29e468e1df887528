"""What the frontend hands the driver for one request, the error a dying scheduler raises, and
the one a start stopped before the engine was built raises."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from engine.request.sampling_params import SamplingParams


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


class StartStopped(Exception):
    """A stop was asked (``reason``: the signal's name) while the scheduler process built its
    engine; the process was ended (it reads no message before it is ready, and nothing was in
    flight)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"stopped by {reason} while the engine was being built")
        self.reason = reason
