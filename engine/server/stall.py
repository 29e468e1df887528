"""The serve loop's own watch on itself: a turn that comes more than ``limit_s`` after the one
before is a stall (the process was stopped, starved, or one step took that long).

Nothing in a stopped process can write while it stands, so the stall is written when the loop
turns again: ``scheduler.stall`` with the wall time of the last turn before it (``since``) and
the work the scheduler held then (it could not change while the loop stood), then the requests
handed in meanwhile are taken in (each ``request.received`` carries its ``arrived`` time), then
``scheduler.resume`` with the stall's length and how many of those arrived during it. While it
stands, the frontend's ``/health`` answers 503 (``EngineDriver.stalled``), by the same limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.request.messages import PoolSnapshot


@dataclass(slots=True, frozen=True)
class Stall:
    seconds: float  # from the last turn before it to the turn that saw it
    since: float  # the wall time of the last turn before it
    seen: float  # the wall time of the turn that saw it


class StallWatch:
    """Call ``turn()`` at the top of every loop turn: the stall it ends, or None."""

    def __init__(
        self,
        limit_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.limit_s, self.clock, self.wall = limit_s, clock, wall
        self.last, self.last_wall = clock(), wall()

    def turn(self) -> Stall | None:
        now, now_wall = self.clock(), self.wall()
        gap = now - self.last
        stall = Stall(gap, self.last_wall, now_wall) if gap > self.limit_s else None
        self.last, self.last_wall = now, now_wall
        return stall


def write_stall(receipts: Receipts, stall: Stall, limit_s: float, snapshot: PoolSnapshot) -> None:
    """``scheduler.stall``: when it began and the work held while it stood."""
    receipts.emit(
        schema.SCHEDULER_STALL,
        since=round(stall.since, 6),
        limit_s=limit_s,
        running=snapshot.running,
        waiting=snapshot.waiting,
        parked=snapshot.parked,
    )


def write_resume(receipts: Receipts, stall: Stall, arrived: int) -> None:
    """``scheduler.resume``: the stall's length and the requests handed in while it stood."""
    receipts.emit(schema.SCHEDULER_RESUME, stalled_s=round(stall.seconds, 3), arrived=arrived)
