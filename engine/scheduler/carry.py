"""A cutover's carry, each move made at an iteration boundary (between steps, when no free
group is open): hold the line, put residents back in line, resize the pool under the
residents, drop the prefix cache. The order and the receipts are ``engine/core/cutover.py``'s; the
moves go through the memory authority (``memory.Memory``) and admission, never the scheduler.

The carry consumes what it moves: a resident put back in line leaves the resident set (its row
freed, its computed KV to the prefix cache) before it joins the line, so no request is ever in
two places; the census after a cutover checks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.memory.kv_pool import KVPool
from engine.memory.pages import whole_pages
from engine.scheduler.admission import running_ceiling
from engine.scheduler.admitter import Admitter
from engine.scheduler.group import GroupView, Line
from engine.scheduler.memory import Memory
from engine.scheduler.rehome import rehome_pool
from engine.scheduler.request import Request
from engine.scheduler.victims import cutover_order


class Hold:
    """Closes the line to new admissions while a drain runs: admission defers everything in
    line with reason ``cutover`` until it opens again. In a group, every rank's line with it
    (``group``: rank 0 hands the others a ``Line`` at the next iteration's top)."""

    def __init__(self, admitter: Admitter, group: GroupView) -> None:
        self.admitter, self.group = admitter, group

    def close(self) -> Hold:
        self.admitter.close_line("cutover")
        self.group.record(Line(closed=True))
        return self

    def open(self) -> None:
        self.admitter.open_line()
        self.group.record(Line(closed=False))


@dataclass(slots=True)
class Carried:
    """What a carry moved: residents re-homed with their KV, and those put back in line."""

    rids: list[str] = field(default_factory=list)
    tokens: int = 0  # KV tokens of the re-homed residents
    requeued: list[str] = field(default_factory=list)
    requeued_tokens: int = 0  # tokens the requeued had generated (they keep them)
    evicted: int = 0  # cached prefix tokens evicted because they did not fit

    def fields(self, cache_tokens: int) -> dict[str, Any]:
        return {
            "rids": self.rids,
            "tokens": self.tokens,
            "requeued": self.requeued,
            "requeued_tokens": self.requeued_tokens,
            "cached_tokens": cache_tokens,
            "evicted": self.evicted,
        }


def in_flight_minimum(live: Iterable[Request], page_size: int) -> int:
    """The smallest pool every live request still fits: its tokens so far and the next one."""
    need = max((len(r.fill_ids) + 1 for r in live), default=1)
    return whole_pages(need, page_size)


def put_back(memory: Memory, reqs: list[Request], need: int, carried: Carried) -> None:
    """Residents back to the front of the line with the tokens they generated (retracted and
    requeued, with receipts): they leave the resident set first."""
    if not reqs:
        return
    memory.retract(reqs, need, "cutover")
    carried.requeued += [r.rid for r in reqs]
    carried.requeued_tokens += sum(len(r.output_ids) for r in reqs)


def resize_pool(memory: Memory, kv: KVPool, capacity: int) -> Carried:
    """A resident carry into a pool of ``capacity`` tokens: residents that cannot fit are put
    back in line, cached prefix is kept up to what fits and the rest evicted (``eviction``,
    reason ``cutover``), then every page in use is copied into the new pool and the slot
    tables re-homed, so the residents keep decoding."""
    alloc, cache, carried = memory.allocator, memory.cache, Carried()
    for req in cutover_order(memory.running):
        short = alloc.used_size() - cache.evictable_size() - capacity
        if short <= 0:
            break
        put_back(memory, [req], short, carried)
    excess = alloc.used_size() - capacity
    if excess > 0:
        carried.evicted = cache.evict(excess, reason="cutover")
    rows = [(r.row, r.kv_len) for r in memory.running]
    rehome_pool(alloc, kv, memory.req_table, cache, rows, capacity)
    carried.rids = [r.rid for r in memory.running]
    carried.tokens = sum(r.kv_len for r in memory.running)
    return carried


def put_all_back(memory: Memory) -> Carried:
    """Every resident back in line, in resident order (a weights carry: they re-prefill with
    the new weights)."""
    carried = Carried()
    put_back(memory, list(memory.running), 0, carried)
    return carried


def check_ceiling(memory: Memory, max_running: int) -> None:
    """Before a carry every rank of a group makes at one boundary: the resident set may hold
    one request above ``max_running`` (a chunked prefill in flight, ``running_ceiling``), which
    the carry takes like any other; more is a broken invariant, and nothing moves. The count is
    the scheduler's, the same on every rank: each decides alike, and rank 0 before it asks the
    others to move."""
    ceiling = running_ceiling(max_running)
    if len(memory.running) > ceiling:
        raise RuntimeError(
            f"{len(memory.running)} residents above the running ceiling {ceiling} "
            f"(max_running {max_running} + one chunked prefill in flight)"
        )


def drop_prefix_cache(memory: Memory) -> int:
    """Evict every cached prefix and empty the host tier (their KV belongs to the old weights);
    returns the device tokens evicted."""
    cache = memory.cache
    before = cache.total_size()
    cache.reset_to_empty(reason="cutover")
    return before - cache.total_size()
