"""The ``iteration`` receipt: when a step writes one, and what it says (the scheduler's snapshot,
the grammar masks' time, the drafts proposed and kept since the last one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.config import EngineConfig
from engine.guided.masks import Masks
from engine.memory.allocator import TokenAllocator
from engine.memory.radix import RadixCache
from engine.model.runner import ModelRunner
from engine.observability import computed, schema
from engine.observability.receipts import Receipts
from engine.request.messages import PoolSnapshot
from engine.scheduler.admission import NewTokenRatio
from engine.scheduler.group import GroupView
from engine.scheduler.memory import Memory
from engine.scheduler.overlap import Flight
from engine.scheduler.request import Request, State
from engine.scheduler.speculate import Speculator


class Reported(Protocol):
    """What the ``iteration`` receipt and the snapshot read of a scheduler (``Scheduler``,
    which builds its ``IterationLog`` and so cannot be imported here): read, never written."""

    config: EngineConfig
    receipts: Receipts
    group: GroupView
    cache: RadixCache
    memory: Memory
    allocator: TokenAllocator
    ratio: NewTokenRatio
    masks: Masks
    spec: Speculator | None
    flight: Flight | None
    runner: ModelRunner
    generated: int

    @property
    def running(self) -> Sequence[Request]: ...
    @property
    def waiting(self) -> Sequence[Request]: ...
    def snapshot(self) -> PoolSnapshot: ...


class IterationLog:
    """One scheduler's iteration receipts: the last one's queue counts and the last iteration
    whose receipt carried a batch digest."""

    def __init__(self, sched: Reported) -> None:  # the Scheduler that owns it
        self.sched = sched
        self.digest_iter = -1  # the last iteration whose receipt carried a batch digest
        self.queue_written = (0, 0, 0)  # running, waiting, parked of the last receipt

    def due(self) -> bool:
        """An ``iteration`` receipt after this step: every ``interval`` steps, and with one rank
        after a step that moved the queue (running, waiting or parked differ from the last
        receipt's), so a slow boot's queue is in its log from its first step. A step that moved
        nothing writes nothing between the samples, so a busy engine writes at most one a step,
        and only where admissions, parks, endings or arrivals changed the counts. None where
        this iteration's receipt is written already (a group's, with its digest: every step
        with work), and none at all with the interval 0 (off)."""
        s = self.sched
        interval, it = s.config.observability.iteration_receipt_interval, s.receipts.iter
        if not interval or self.digest_iter == it:
            return False
        if it % interval == 0:
            return True
        if s.group.world > 1:
            return False
        parked = sum(1 for r in s.running if r.state is State.PARKED)
        return (len(s.running) - parked, len(s.waiting), parked) != self.queue_written

    def write(self, digest: str | None = None) -> None:
        sched = self.sched
        s = sched.snapshot()
        self.queue_written = (s.running, s.waiting, s.parked)
        extra: dict[str, object] = {} if digest is None else {"digest": digest}
        if (mask_ms := sched.masks.take_ms()) is not None:
            extra["mask_ms"] = round(mask_ms, 3)
            extra["constrained"] = sum(r.guided is not None for r in sched.running)
        if sched.spec is not None:
            extra |= sched.spec.iteration_fields()
        if sched.flight is not None:  # steps planned beside a forward, and those that waited
            extra |= sched.flight.iteration_fields()
        if sched.runner.graphs is not None:  # decode steps replayed, and forwards run eagerly
            extra["graph_steps"], extra["eager_steps"] = sched.runner.steps.take()
        self.digest_iter = sched.receipts.iter if digest is not None else self.digest_iter
        sched.receipts.emit(
            schema.ITERATION,
            running=s.running,
            waiting=s.waiting,
            parked=s.parked,
            **s.progress(),
            token_usage=round(s.token_usage, 4),
            avail=s.kv_free,
            evictable=s.kv_evictable,
            staged=s.kv_staged,
            cached=s.kv_cached,
            ratio=round(s.new_token_ratio, 4),
            **extra,
        )


def snapshot_of(sched: Reported) -> PoolSnapshot:
    """A scheduler's state after a step: the ``iteration`` receipt, /metrics and /health read
    it (with several ranks, the memory numbers are the group's, agreed)."""
    cache, mem, running = sched.cache, sched.memory, sched.running
    parked = sum(1 for r in running if r.state is State.PARKED)
    return PoolSnapshot(
        running=len(running) - parked,
        parked=parked,
        waiting=len(sched.waiting),
        kv_used=sched.allocator.used_size() - cache.evictable_size(),
        kv_cached=cache.total_size(),
        kv_evictable=mem.evictable(),
        kv_free=mem.available(),
        kv_staged=mem.staged(),
        kv_total=mem.capacity,
        new_token_ratio=sched.ratio.value,
        receipts=dict(sched.receipts.counts),
        receipts_written=dict(sched.receipts.written),
        receipts_failed=dict(sched.receipts.failed),
        tallies=dict(sched.receipts.tallies),
        **computed.progress(sched.generated, sched.receipts.counts),
        spec=sched.spec.counts() if sched.spec is not None else None,
        store=cache.keeper.store.capacity() if cache.keeper is not None else None,
    )
