"""The production relief ladder: evict -> spill -> throttle -> retract, then admission parks.

Each rung is asked for the tokens still short and says what it paid, in device tokens ``alloc``
can hand out now (``relief.rung``); a rung that pays short or raises is an outcome and the
ladder goes on (``ReliefRegistry.relieve``). Every rung is rank-local: it reads and frees this
rank's own memory and takes no collective.

* evict: cold cached prefix whose device copy costs nothing to let go: with a host tier, nodes
  whose KV is on the host too (the host copy stays); without one, LRU eviction (dropped).
* spill (only with a host tier): cold device-only nodes copied to the host, their device pages
  freed (``tier.spill``); a node the host cannot hold is dropped.
* throttle: pays nothing now. It closes the line to new admissions for K iterations
  (``relief.throttle``; ``admission.defer`` reason ``throttle``), so what the next rung frees is
  not handed straight back to newcomers and the retraction does not repeat next round.
* retract (decode funding and a would-be park: the step's slots are not taken yet at either):
  running requests go back to the front of the line through the one actuator
  (``retract.py``), chosen by ``pick_victims``. At ``decode`` what they held goes to the prefix
  cache and is evicted (or spilled) to pay. At ``park`` the victims are decoders only (never the
  chunk being funded, never the last decoder); what they held and the decode tokens reserved
  for them come back to admission's budget, and the throttle asked just before keeps newcomers
  from taking it.
* park is not a rung: it is admission's floor. A chunk the budget still cannot fund parks.

Evict and spill are not asked at ``park``: the budget a chunk parks on already counts evictable
tokens, so shedding them pays nothing there.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from engine.mem.allocator import TokenAllocator
from engine.mem.radix import RadixCache
from engine.obs import schema
from engine.obs.receipts import Receipts
from engine.sched.group import AgreedPool
from engine.sched.relief import SITES, ReliefRegistry
from engine.sched.request import Request, State
from engine.sched.victims import pick_victims


class Laddered(Protocol):
    """What the rungs read and move of a scheduler (the scheduler itself, structurally)."""

    allocator: TokenAllocator
    pool: AgreedPool  # the numbers decisions read (agreed across the ranks of a group)
    cache: RadixCache
    relief: ReliefRegistry
    receipts: Receipts
    admitter: Any
    running: list[Request]
    waiting: deque[Request]
    page_size: int

    def _retract(self, victims: list[Request], need: int, site: str = ...) -> None: ...


class Throttle:
    """The line to new admissions is closed through iteration ``until`` (admission reads it)."""

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.until = 0

    def active(self, iteration: int) -> bool:
        return iteration <= self.until


class Rungs:
    """The rungs of one scheduler, as bound methods the registry calls."""

    def __init__(self, sched: Laddered, throttle: Throttle) -> None:
        self.sched = sched
        self.throttle = throttle

    def _site(self) -> str:
        return self.sched.relief.site or "relief"

    def evict(self, asked: int) -> int:
        cache = self.sched.cache
        tiered = cache.tier is not None
        return cache.evict(asked, reason=self._site(), host_backed_only=tiered)

    def spill(self, asked: int) -> int:
        return self.sched.cache.evict(asked, reason=self._site(), rid=self.sched.relief.rid)

    def hold(self, asked: int) -> int:
        s = self.sched
        self.throttle.until = s.receipts.iter + self.throttle.iterations
        s.receipts.emit(
            schema.RELIEF_THROTTLE, iterations=self.throttle.iterations, until=self.throttle.until,
            running=len(s.running), waiting=len(s.waiting), site=self._site(),
        )  # fmt: skip
        return 0  # nothing is freed now: it keeps the next rung's tokens from going straight out

    def retract(self, asked: int) -> int:
        s = self.sched
        if s.relief.site == "park":
            return self._retract_decoders(asked)
        if len(s.running) < 2:
            return 0  # never the last running request: alone, it fits or is aborted
        before = s.pool.available_size()
        need = before + asked
        victims = pick_victims(
            s.running, need=need, available=before, evictable=s.pool.evictable_size(),
            page_size=s.page_size,
        )  # fmt: skip
        s._retract(victims, need)
        short = need - s.pool.available_size()
        if short > 0 and s.cache.evictable_size() > 0:
            s.cache.evict(short, reason=self._site(), rid=s.relief.rid)
        return s.pool.available_size() - before

    def _retract_decoders(self, asked: int) -> int:
        """Decoders back in line until their memory covers ``asked``; paid: what available +
        evictable grew by, measured."""
        s = self.sched
        decoders = [r for r in s.running if r.state is State.RUNNING and not r.prefilling]
        if len(decoders) < 2:
            return 0  # the last decoder finishes first; the chunk waits for it
        before = s.pool.available_size() + s.pool.evictable_size()
        victims = pick_victims(
            decoders, need=asked, available=0, evictable=0, page_size=s.page_size
        )
        s._retract(victims, asked, "park")
        return s.pool.available_size() + s.pool.evictable_size() - before


def register_ladder(sched: Laddered, throttle_iterations: int) -> list[str]:
    """Register the production rungs, in order, on ``sched``'s registry; returns their names.
    The spill rung exists only where a host tier is attached."""
    throttle = Throttle(throttle_iterations)
    rungs = Rungs(sched, throttle)
    reg = sched.relief
    memory = [site for site in SITES if site != "park"]  # a park's budget counted them already
    reg.register("evict", rungs.evict, memory)
    if sched.cache.tier is not None:
        reg.register("spill", rungs.spill, memory)
    reg.register("throttle", rungs.hold, SITES)
    reg.register("retract", rungs.retract, ("decode", "park"))  # no slot of the step taken yet
    sched.admitter.throttle, sched.admitter.relief = throttle, reg
    names = [name for name, _, _ in reg.providers]
    sched.receipts.notice("relief_ladder", "relief ladder: " + " -> ".join(names) + " -> park")
    return names


def relieve_decode(sched: Laddered, need: int) -> bool:
    """Room for the step's ``need`` decode tokens: the ladder first when rungs are registered,
    then the actuators every boot has (evict, else retract victims) as its floor. True when it
    made progress, measured rather than believed: more tokens available or fewer running."""
    alloc, cache = sched.pool, sched.cache  # agreed numbers: every rank does the same
    avail, running = alloc.available_size(), len(sched.running)
    if sched.relief.serves("decode"):
        sched.relief.relieve(need - avail, "decode")
        if alloc.available_size() > avail or len(sched.running) < running:
            return True
    if cache.evictable_size() > 0:
        cache.evict(need - alloc.available_size(), reason="decode")
        return True
    if len(sched.running) > 1:
        victims = pick_victims(
            sched.running, need=need, available=alloc.available_size(),
            evictable=alloc.evictable_size(), page_size=sched.page_size,
        )  # fmt: skip
        sched._retract(victims, need)
        return True
    return False
