"""Retraction's victim choice, as a pure decision over the running requests and plain numbers.

The actuator (``Memory.retract``) takes the victims back to the front of the line; this
module only says who. Never the last running request: one request alone either fits the pool
or is aborted with the numbers (``exceeds_pool``), never retracted into a loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.memory.pages import whole_pages
from engine.scheduler.request import Request


def victim_order(reqs: Sequence[Request]) -> list[Request]:
    """Retraction order: fewest generated tokens first, ties by the longest prompt."""
    return sorted(reqs, key=lambda r: (len(r.output_ids), -r.prompt_len))


def pick_victims(
    running: Sequence[Request], *, need: int, available: int, evictable: int, page_size: int
) -> list[Request]:
    """Victims in retraction order until what they free covers ``need`` tokens, plus a page of
    margin per victim: always at least one, never the last running request."""
    victims: list[Request] = []
    freed = available + evictable
    for req in victim_order(running)[: len(running) - 1]:
        victims.append(req)
        freed += whole_pages(req.kv_len, page_size)
        if freed >= need + page_size * len(victims):
            break
    return victims


def cutover_order(reqs: Sequence[Request]) -> list[Request]:
    """Who a pool cutover puts back in line first when the residents do not all fit: decoding
    requests, fewest generated first; a request mid-prefill last (put back, its prompt would
    count again in the backlog)."""
    return sorted(reqs, key=lambda r: (not r.output_ids, len(r.output_ids), -r.prompt_len))
