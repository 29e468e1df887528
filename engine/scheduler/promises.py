"""The up-front promise a pool cutover must keep, and the memory a new pool must find.

A served request is promised at intake (``Scheduler.add_request(promise=True)``): its prompt and
``max_tokens`` fit the pool, so it is never ended for the pool's size. A pool cutover to a size
that one of those promises no longer fits is refused (409, naming each request and what it was
promised), unless the cutover asks to cap them (``promises = "cap"``): each is then lowered to
what the new pool holds (a ``request.cap`` receipt) and ends with ``length`` there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from engine.memory.kv_pool import mem_available_bytes
from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.scheduler.request import Request

ON_BROKEN = ("refuse", "cap")  # what a pool cutover does with promises its new size breaks


def broken(live: Iterable[Request], capacity: int) -> list[Request]:
    """The promised requests whose prompt + max_tokens a pool of ``capacity`` does not hold."""
    return [r for r in live if r.promised is not None and r.promised > capacity]


def named(reqs: Iterable[Request]) -> list[dict[str, Any]]:
    """Each request and what it was promised, as the cutover's answer lists them."""
    return [{"rid": r.rid, "promised": r.promised} for r in reqs]


def refusal(reqs: list[Request], capacity: int) -> str:
    listed = ", ".join(f"{r.rid} (promised {r.promised})" for r in reqs)
    return (
        f"a pool of {capacity} tokens breaks the promise made to {len(reqs)} request(s) "
        f"(prompt + max_tokens): {listed}; ask with promises 'cap' to end them with length at "
        "the new bound"
    )


def cap(reqs: list[Request], capacity: int, cid: str, receipts: Receipts) -> None:
    """Lower each request's max_tokens to what a pool of ``capacity`` holds (a decision: one
    ``request.cap`` receipt each). The cutover's in-flight minimum has already made sure each
    still has room for its next token."""
    for req in reqs:
        promised, limit = req.promised, capacity - req.prompt_len
        req.params = dataclasses.replace(req.params, max_tokens=limit)
        req.promised = capacity
        receipts.emit(
            schema.REQUEST_CAP, rid=req.rid, promised=promised, max_new_tokens=limit, reason=cid
        )


def memory_free(device: str) -> int:
    """Bytes a new pool can take on ``device`` now: the CUDA device's free memory, or the
    host's available memory on the CPU."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return mem_available_bytes()


def memory_refusal(tokens: int, per_token: int, device: str) -> str | None:
    """Why a pool of ``tokens`` cannot be allocated beside the serving one, or None when it can
    (both pools live at once while the residents' KV is copied)."""
    wanted, free = tokens * per_token, memory_free(device)
    if wanted <= free:
        return None
    return (
        f"a pool of {tokens} tokens needs {wanted:,} bytes ({per_token:,} per token) and "
        f"{device} has {free:,} bytes available"
    )
