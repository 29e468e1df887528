"""Faults the engine never commits on its own, injected by tests to prove a checker catches them."""

from __future__ import annotations

from engine.scheduler.request import State
from engine.scheduler.scheduler import Scheduler


def drop_request(sched: Scheduler, rid: str) -> None:
    """Lose a request without an ending receipt (the fault the auditor's no_request_lost window
    must catch). Its memory is handed back so the ledger still balances."""
    req = sched.requests.pop(rid)
    if req in sched.waiting:
        sched.waiting.remove(req)
    sched.memory.holdings.release(req)
    req.state = State.FINISHED
