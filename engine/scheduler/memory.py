"""Memory: the one authority over KV memory: how it is made, taken and given back. It owns the
allocator, the request table, the radix cache (and the host tier and the durable store under
it), the relief ladder and what each request holds (``holdings``), and answers:

* the numbers a decision reads (``available``, ``evictable``, ``staged``, ``capacity``): this
  rank's own, less what it holds above the group's MIN this iteration (law 2; one rank: its
  own); and ``fresh_slots``, what more tokens of a request take (the same on every rank);
* ``make_room(short, site)``: find ``short`` more tokens where memory runs short (``site``): the
  ladder, in the order written once in ``_ladder`` (evict -> spill -> throttle -> retract), each
  rung fallible (law 4), then the backstop every boot has (eviction; retraction at ``decode``);
* ``alloc(req, n, site)``: the allocation-site net (law 5): flush the staged frees, one
  ``make_room``, one retry of the same call, then the original error with the numbers;
* ``frees_together()``: the frees made inside it staged and applied as one group;
* ``retract``: the one actuator that takes running requests back to the front of the line;
* ``holdings`` (``holdings.py``): a request's prefix claimed, loaded from the host tier and the
  store, its start (its row, its prefix slots), its release and the shrink of its drafts.

Admission, decode funding, the net, retraction and a cutover all come here; none of them takes
the scheduler. Every rung is rank-local: it frees this rank's own memory, no collective.

Where it is asked (``site``): ``decode`` (the step's decode tokens), ``park`` (an in-flight
chunk below one page: its budget counted evictable tokens already, so only the throttle and
retraction of decoders serve it; park itself is admission's backstop, not a rung), ``admission``
(the evictable tokens admission counted are paid), ``alloc_net`` (an allocation failed after
the staged frees were flushed). Retraction serves ``decode`` and ``park`` only: no slot of the
step is taken yet at either. A rung registered from outside (``register``: another tenant of
the pool) is asked after the production ones, by default at ``alloc_net`` alone.

What a retraction says about the new-token ratio depends on the site: at ``decode`` the running
requests needed more than the ratio predicted, so it rises; at ``park`` and ``cutover`` the
prediction was not what left no room, and it stays.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import torch

from engine.memory.allocator import TokenAllocator
from engine.memory.pages import whole_pages
from engine.memory.radix import RadixCache
from engine.memory.req_table import ReqToTokenPool
from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.scheduler.admission import NewTokenRatio
from engine.scheduler.group import GroupView, Terms
from engine.scheduler.holdings import Holdings
from engine.scheduler.request import Request, State
from engine.scheduler.victims import pick_victims, victim_order

Provider = Callable[[int], int]  # asked for n tokens, returns the tokens it made available
SITES = ("decode", "park", "admission", "alloc_net")
MEMORY_SITES = ("decode", "admission", "alloc_net")  # where shedding cached KV pays


class KVPoolExhausted(RuntimeError):
    """An allocation failed after the whole net (flush, make room, retry)."""


class Rung(NamedTuple):
    name: str
    provider: Provider
    sites: frozenset[str]


class Paid(NamedTuple):
    """What one ``make_room`` did: the rungs' own reports (``relieved``), the backstop's eviction
    (``evicted``), and what was measured: tokens available gained, requests retracted."""

    relieved: int
    evicted: int
    gained: int
    retracted: int

    @property
    def progress(self) -> bool:
        return self.gained > 0 or self.retracted > 0


class Throttle:
    """The line to new admissions is closed through iteration ``until`` (admission reads it)."""

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.until = 0

    def active(self, iteration: int) -> bool:
        return iteration <= self.until

    def close(self, iteration: int) -> int:
        """Close the line from ``iteration`` for ``iterations``; returns the last one closed."""
        self.until = iteration + self.iterations
        return self.until


class Memory:
    """``running`` and ``waiting``: the scheduler's lines (retraction moves requests from the
    first to the front of the second); ``ladder`` False registers no production rung."""

    def __init__(
        self,
        allocator: TokenAllocator,
        req_table: ReqToTokenPool,
        cache: RadixCache,
        group: GroupView,
        receipts: Receipts,
        lines: tuple[list[Request], deque[Request]],
        ratio: NewTokenRatio,
        ladder: bool = True,
        throttle_iterations: int = 8,
        settle: Callable[[], None] | None = None,
    ) -> None:
        self.allocator, self.req_table, self.cache = allocator, req_table, cache
        self.group, self.receipts, self.ratio = group, receipts, ratio
        self.running, self.waiting = lines
        self.holdings = Holdings(allocator, req_table, cache, self.running)
        self.page_size = allocator.page_size
        self.throttle = Throttle(throttle_iterations)
        # overlap: waits for the forward in flight before relief lets go of what it reads
        self.settle = settle or (lambda: None)
        self.rungs: list[Rung] = self._ladder() if ladder else []
        self._asking: tuple[str, str | None] = ("relief", None)  # the site and rid being served
        if ladder:
            names = " -> ".join(r.name for r in self.rungs)
            receipts.notice("relief_ladder", f"relief ladder: {names} -> park")

    def _ladder(self) -> list[Rung]:
        """The production rungs, in ladder order (the one place it is written)."""
        tiered = self.cache.tier is not None
        rungs = [Rung("evict", self._evict, frozenset(MEMORY_SITES))]
        if tiered:  # cold device-only prefix goes to the host instead of being dropped
            rungs.append(Rung("spill", self._spill, frozenset(MEMORY_SITES)))
        rungs.append(Rung("throttle", self._hold, frozenset(SITES)))
        rungs.append(Rung("retract", self._retract_rung, frozenset({"decode", "park"})))
        return rungs

    # -- the numbers decisions read (law 2) ---------------------------------------------------

    def local(self) -> Terms:
        """This rank's own terms, before any agreement."""
        a = self.allocator
        return Terms(a.available_size(), self.cache.evictable_size(), a.staged_size())

    def terms(self) -> Terms:
        return self.local() - self.group.surplus

    def available(self) -> int:
        """Tokens ``alloc`` can hand out now (staged frees are not available), agreed."""
        return self.allocator.available_size() - self.group.surplus.available

    def evictable(self) -> int:
        """Cached tokens no running request locks: what eviction can free now, agreed."""
        return self.cache.evictable_size() - self.group.surplus.evictable

    def staged(self) -> int:
        """Frees waiting for their group to end (the net flushes them), agreed."""
        return self.allocator.staged_size() - self.group.surplus.staged

    @property
    def capacity(self) -> int:
        """The pool the group can count on: its smallest rank's."""
        return self.group.capacity(self.allocator.capacity)

    def fits(self, tokens: int) -> bool:
        """Whether ``tokens`` fit the whole pool at all (whole pages)."""
        return whole_pages(tokens, self.page_size) <= self.capacity

    def fresh_slots(self, req: Request, n: int) -> int:
        """Fresh slots ``n`` more tokens of ``req`` take from the pool (its partial last page
        holds some of them for nothing)."""
        return self.allocator.fresh_slots(req.kv_len, n)

    # -- making room (law 4) ------------------------------------------------------------------

    def register(
        self, name: str, provider: Provider, sites: Iterable[str] = ("alloc_net",)
    ) -> None:
        """Another tenant of the pool joins the ladder after the rungs before it, asked at
        ``sites``; it frees its own memory and returns the tokens it made available."""
        unknown = set(sites) - set(SITES)
        if unknown:
            raise ValueError(f"relief provider {name!r}: unknown sites {sorted(unknown)}")
        self.rungs.append(Rung(name, provider, frozenset(sites)))

    def serves(self, site: str) -> bool:
        """Whether any rung is asked at ``site``."""
        return any(site in r.sites for r in self.rungs)

    def make_room(self, short: int, site: str, rid: str | None = None) -> Paid:
        """``short`` more tokens at ``site``: the ladder where a rung serves it, then the
        backstop. At ``decode`` the backstop acts only when the ladder moved nothing (evict what is cached,
        else retract); at ``admission`` and ``alloc_net`` it evicts what is still short (the
        evictable counter promised it); at ``park`` there is none (the chunk parks)."""
        self.settle()
        before, running = self.available(), len(self.running)
        ladder = self.serves(site)
        relieved = self._climb(short, site, rid) if ladder else 0
        evicted = 0
        if site == "decode":
            moved = self.available() > before or len(self.running) < running
            if not moved:  # the ladder moved nothing (or there is none): the backstop acts
                if self.cache.evictable_size() > 0:
                    evicted = self.cache.evict(short, reason=site)
                elif len(self.running) > 1:
                    self._retract_victims(short + before)
        elif site in MEMORY_SITES and (still := short - (self.available() - before)) > 0:
            evicted = self.cache.evict(still, reason=site, rid=rid)
            still = short - (self.available() - before)
            if site == "alloc_net" and not ladder and still > 0:
                self._climb(still, site, rid)  # no rung serves it: the climb says so, once
        return Paid(relieved, evicted, self.available() - before, running - len(self.running))

    def _climb(self, short: int, site: str, rid: str | None) -> int:
        """Each rung serving ``site`` once, in order, until ``short`` is met; a rung that raises
        or pays short is an outcome (``relief.rung``), not a crash. Returns what they reported."""
        if not self.rungs:
            self.receipts.notice(
                "empty_relief_registry",
                "no relief provider is registered at the allocation site: "
                "admission is the whole guarantee",
            )
            return 0
        rungs = [r for r in self.rungs if site in r.sites]
        self.receipts.emit(schema.RELIEF_ENGAGE, shortfall=short, rungs=len(rungs), site=site)
        self._asking, freed = (site, rid), 0
        try:
            for name, provider, _ in rungs:
                if freed >= short:
                    break
                asked = short - freed
                try:
                    paid = max(0, int(provider(asked)))
                    outcome, error = ("paid" if paid >= asked else "short"), None
                except Exception as e:  # an outcome, not a crash: the ladder goes on
                    paid, outcome, error = 0, "raised", f"{type(e).__name__}: {e}"
                freed += paid
                self.receipts.emit(
                    schema.RELIEF_RUNG,
                    rung=name,
                    asked=asked,
                    paid=paid,
                    outcome=outcome,
                    error=error,
                    site=site,
                )
        finally:
            self._asking = ("relief", None)
        return freed

    # -- the rungs ----------------------------------------------------------------------------

    def _evict(self, asked: int) -> int:
        """Cold cached prefix whose device copy costs nothing to let go: with a host tier the
        nodes whose KV is on the host too, without one LRU eviction."""
        tiered = self.cache.tier is not None
        return self.cache.evict(asked, reason=self._asking[0], host_backed_only=tiered)

    def _spill(self, asked: int) -> int:
        """Cold device-only nodes copied to the host tier, their device pages freed."""
        site, rid = self._asking
        return self.cache.evict(asked, reason=site, rid=rid)

    def _hold(self, asked: int) -> int:
        """Close the line for K iterations; pays nothing now, but keeps what the next rung
        frees from going straight to newcomers (and the retraction from repeating)."""
        t = self.throttle
        until = t.close(self.receipts.iter)
        self.receipts.emit(
            schema.RELIEF_THROTTLE,
            iterations=t.iterations,
            until=until,
            running=len(self.running),
            waiting=len(self.waiting),
            site=self._asking[0],
        )
        return 0

    def _retract_rung(self, asked: int) -> int:
        """At ``decode``: victims back in line, what they held to the cache, evicted to pay.
        At ``park``: decoders only (never the chunk, never the last decoder), paid in what
        available + evictable grew by. Never the last running request."""
        site, rid = self._asking
        if site == "park":
            decoders = [r for r in self.running if r.state is State.RUNNING and not r.prefilling]
            if len(decoders) < 2:
                return 0  # the last decoder finishes first; the chunk waits for it
            before = self.available() + self.evictable()
            victims = pick_victims(
                decoders, need=asked, available=0, evictable=0, page_size=self.page_size
            )
            self.retract(victims, asked, "park")
            return self.available() + self.evictable() - before
        if len(self.running) < 2:
            return 0  # alone, it fits or is aborted
        before = self.available()
        need = before + asked
        self._retract_victims(need)
        short = need - self.available()
        if short > 0 and self.cache.evictable_size() > 0:
            self.cache.evict(short, reason=site, rid=rid)
        return self.available() - before

    def _retract_victims(self, need: int) -> None:
        victims = pick_victims(
            self.running,
            need=need,
            available=self.available(),
            evictable=self.evictable(),
            page_size=self.page_size,
        )
        self.retract(victims, need, "decode")

    # -- taking and giving back ---------------------------------------------------------------

    def alloc(self, req: Request, n: int, site: str) -> torch.Tensor:
        """Slots for ``n`` new tokens of ``req``, written into its row of the table, through
        the net: flush, one ``make_room``, one retry of the same call, then raise."""
        alloc = self.allocator
        last = self.holdings.last_slot(req)  # an extension continues on its last page

        def call() -> torch.Tensor | None:
            return alloc.alloc_extend(req.kv_len, n, last)

        slots = call()
        if slots is None:
            need, r = alloc.fresh_slots(req.kv_len, n), self.receipts
            if staged := alloc.staged_size():
                freed = alloc.flush_free_group()
                r.emit(
                    schema.ALLOC_FLUSH,
                    need=need,
                    staged=staged,
                    freed=freed,
                    site=site,
                    rid=req.rid,
                )
            if (short := need - alloc.available_size()) > 0:
                paid = self.make_room(short, "alloc_net", req.rid)
                r.emit(
                    schema.ALLOC_RELIEF,
                    need=need,
                    freed=paid.evicted + paid.relieved,
                    evicted=paid.evicted,
                    relieved=paid.relieved,
                    site=site,
                    rid=req.rid,
                )
            slots = call()  # the retry is the same call as the first attempt
            r.emit(schema.ALLOC_RETRY, need=need, ok=slots is not None, site=site, rid=req.rid)
            if slots is None:
                self._exhausted(need, site, req.rid)
        self.holdings.write(req, slots)
        return slots

    def alloc_decode(self, reqs: list[Request], site: str) -> list[torch.Tensor]:
        """A slot each for ``reqs``' next tokens, written into their rows: one allocation for
        them all when the pool holds them all, else each through the net (``alloc``)."""
        if not reqs:
            return []
        held, last = [r.kv_len for r in reqs], [self.holdings.last_slot(r) for r in reqs]
        slots = self.allocator.alloc_decode(held, last)
        if slots is None:  # the net, request by request: flush, relief, retry, then raise
            return [self.alloc(r, 1, site) for r in reqs]
        self.holdings.write_decode(reqs, slots)
        return list(slots.split(1))

    @contextlib.contextmanager
    def frees_together(self) -> Iterator[None]:
        """The frees made inside are staged and applied together at its end (one group,
        opened once: an inner one joins the group already open). Staged frees are not
        available (law 1); the net flushes them before an allocation fails (law 5)."""
        opened = not self.allocator.group_open
        if opened:
            self.allocator.free_group_begin()
        try:
            yield
        finally:
            if opened:
                self.allocator.free_group_end()

    def _exhausted(self, need: int, site: str, rid: str) -> None:
        a = self.allocator
        numbers = dict(
            need=need,
            available=a.available_size(),
            staged=a.staged_size(),
            evictable=self.cache.evictable_size(),
            capacity=a.capacity,
        )
        self.receipts.emit(schema.ALLOC_OOM, site=site, rid=rid, **numbers)
        raise KVPoolExhausted(
            f"KV pool cannot fund {need} tokens for {rid} at {site}: "
            + ", ".join(f"{k} {v}" for k, v in numbers.items())
        )

    def retract(self, victims: list[Request], need: int, site: str) -> None:
        """Running ``victims`` back to the front of the line, first victim first, to free
        ``need`` tokens at ``site``: one ``retract`` receipt with the numbers the choice was made
        on, then a ``requeue`` per victim. Their computed KV goes to the prefix cache."""
        running = self.running
        # who the victims were chosen from: at a park, the decoders only (never a chunk in flight)
        chosen_from = [r for r in running if not r.prefilling] if site == "park" else running
        # candidates: [rid, generated, prompt_tokens] in retraction order
        candidates = [[r.rid, len(r.output_ids), r.prompt_len] for r in victim_order(chosen_from)]
        available, evictable = self.available(), self.evictable()
        decoded = sum(len(r.output_ids) for r in running)
        remaining = sum(r.params.max_tokens - len(r.output_ids) for r in running)
        freed = 0
        for req in victims:
            freed += self.holdings.private_of(req) + req.cached_len
            self.holdings.release(req)
            req.retractions += 1
            req.state = State.WAITING
        old = new = self.ratio.value
        if site == "decode":
            old, new = self.ratio.on_retract(decoded, remaining, len(victims))
        self.receipts.emit(
            schema.RETRACT,
            rids=[r.rid for r in victims],
            tokens_freed=freed,
            ratio_old=round(old, 4),
            ratio_new=round(new, 4),
            need=need,
            available=available,
            evictable=evictable,
            candidates=candidates,
            running_after=len(running),
            site=site,
        )
        self.waiting.extendleft(reversed(victims))
        for req in victims:
            self.receipts.emit(schema.REQUEUE, rid=req.rid, generated=len(req.output_ids))
