"""The next step planned while this step's forward runs (``--overlap-schedule``).

A step's forward runs on a worker thread (torch's kernels leave the interpreter lock while they
compute; with a GPU the thread waits on the device) while the scheduler plans the next step on
its own thread: it funds the next decodes, admits, takes the next slots. Nothing is guessed but
slots: a planned decode's token is the one this step samples, put into its entry at launch
(``Scheduler._launch``); a request that ends on this step's token gives its planned slot back
(``Holdings.release`` shrinks it first, as a rejected draft's) and its entry is dropped at
launch. A request whose next token is its last (``Request.last_ahead``) is not planned for.

Beside a forward runs only what touches memory that forward does not read or write: free
slots, a new row, positions past the batch's. Relief (an eviction, a spill, a retraction, an
end for the pool) lets go of KV that running requests hold, so ``Memory.make_room`` first
waits for the forward to land (``Flight.settle``); this step's results are applied after the
plan, and a request that relief sent back in line loses its result (``Flight.current``).

One rank alone and no drafts: a group's ranks plan in lockstep over collectives, and a draft
is proposed from the token before it (``EngineConfig``'s rules refuse the others).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.scheduler.request import Request, State


class Flight:
    """The forward in flight, on one worker thread, and what overlapping did since the last
    ``iteration`` receipt: steps planned beside a forward (``ahead``), plans that waited for
    one to land (``waited``: relief), planned entries dropped at launch (``dropped``: their
    requests ended or went back in line meanwhile)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device  # a thread's current CUDA device is its own: the worker sets it
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attest-forward")
        self._future: Future[torch.Tensor] | None = None
        self._tags: list[tuple[Request, int]] = []
        self.ahead = self.waited = self.dropped = 0

    def launch(self, forward: Callable[[], torch.Tensor], reqs: list[Request]) -> None:
        """Run ``forward`` on the worker thread; ``reqs``: the batch's requests, in order."""
        assert self._future is None, "a forward is already in flight"
        self._tags = [(r, r.retractions) for r in reqs]
        self._future = self._pool.submit(_inference, forward, self.device)

    @property
    def flying(self) -> bool:
        """Whether a forward is launched and not yet landed (``land``)."""
        return self._future is not None

    def settle(self) -> None:
        """Wait until the forward in flight has run (its logits kept for ``land``): relief may
        then let go of what it read and wrote. Counted once a plan."""
        if self._future is not None and not self._future.done():
            self.waited += 1
            self._future.exception()  # waits; its error is ``land``'s to raise

    def land(self) -> torch.Tensor:
        """The forward's logits, once it has run (its error, if it raised)."""
        assert self._future is not None, "no forward in flight"
        future, self._future = self._future, None
        return future.result()

    def current(self) -> list[bool]:
        """Per request of the landed batch: whether its result still applies (it runs still,
        and was not sent back in line while the next step was planned)."""
        return [r.state is State.RUNNING and r.retractions == n for r, n in self._tags]

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

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _inference(forward: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
    """``forward`` under inference mode, and on a GPU with ``device`` current: both are a
    thread's own, so the worker enters them."""
    with torch.inference_mode():
        if device.type != "cuda":
            return forward()
        with torch.cuda.device(device):
            return forward()
