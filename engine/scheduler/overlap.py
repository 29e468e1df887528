"""The next step planned while this step's forward runs (``--overlap-schedule``).

The scheduler launches a step's forward on its own thread and plans the next step meanwhile on a
worker thread (``Flight.beside``): it funds the next decodes, admits, takes the next slots. The
forward stays on the thread that runs every other heavy kernel: OpenMP gives each thread that
opens a parallel region a team of its own, and the idle team of a second thread spins on the
cores the working one needs (with a GPU the thread waits on the device either way). Nothing is
guessed but slots: a planned decode's token is the one this step samples, put into its entry at
launch (``Scheduler._launchable``); a request that ends on this step's token gives its planned
slot back (``Holdings.release`` shrinks it first, as a rejected draft's) and its entry is dropped
at launch. A request whose next token is its last (``Request.last_ahead``) is not planned for.

Beside a forward runs only what touches memory that forward does not read or write: free
slots, a new row, positions past the batch's. Relief may let go of KV the forward reads (a
retraction or an end for the pool frees a running request's, and its eviction and spills may
then move those pages), so ``Memory.make_room`` first waits for the forward to land
(``Flight.settle``); this step's results are applied after the plan, and a request that relief
sent back in line loses its result (``Flight.current``).

One rank alone and no drafts: a group's ranks plan in lockstep over collectives, and a draft
is proposed from the token before it (``EngineConfig``'s rules refuse the others).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

from engine.scheduler.request import Request, State

T = TypeVar("T")
LIVE = (State.RUNNING, State.PARKED)  # a request whose planned entries may still run


class Flight:
    """The plan made beside a forward, on one worker thread, and what overlapping did since
    the last ``iteration`` receipt: steps planned beside a forward (``ahead``), plans that
    waited for one to land (``waited``: relief), planned entries dropped at launch
    (``dropped``: their requests ended or went back in line meanwhile)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device  # a thread's current CUDA device is its own: the worker sets it
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attest-plan")
        self._landed = threading.Event()
        self._landed.set()
        self._tags: list[tuple[Request, int]] = []
        self.ahead = self.waited = self.dropped = 0

    def beside(self, reqs: list[Request], plan: Callable[[], T]) -> Future[T]:
        """Start ``plan`` on the worker thread while the caller runs the forward of ``reqs``
        (the batch's requests, in order) and then calls ``land``."""
        self._tags = [(r, r.retractions) for r in reqs]
        self._landed.clear()
        return self._pool.submit(_on, self.device, plan)

    def land(self) -> None:
        """The forward has run: relief may let go of what it read and wrote."""
        self._landed.set()

    def settle(self) -> None:
        """Wait until the forward beside this plan has run (at once where none runs). Counted
        once a plan."""
        if not self._landed.is_set():
            self.waited += 1
            self._landed.wait()

    def current(self) -> list[bool]:
        """Per request of the landed batch: whether its result still applies (it runs still,
        and was not sent back in line while the next step was planned)."""
        return [r.state in LIVE and r.retractions == n for r, n in self._tags]

    def tally(self, ahead: int = 0, dropped: int = 0) -> None:
        """Count a step planned beside a forward, and planned entries dropped at launch."""
        self.ahead += ahead
        self.dropped += dropped

    def iteration_fields(self) -> dict[str, int]:
        """``overlap_ahead``, ``overlap_waited``, ``overlap_dropped`` since the last call."""
        fields = {
            "overlap_ahead": self.ahead,
            "overlap_waited": self.waited,
            "overlap_dropped": self.dropped,
        }
        self.ahead = self.waited = self.dropped = 0
        return fields


def _on(device: torch.device, plan: Callable[[], T]) -> T:
    """``plan`` with ``device`` current on a GPU: a thread's own, so the worker enters it."""
    if device.type != "cuda":
        return plan()
    with torch.cuda.device(device):
        return plan()
