"""The scheduler's invariant checks (laws 6 and 7): the ledger balances, every request is in
exactly one state, the running ceiling holds, a constrained request's grammar has taken exactly
its output.

Check mode (``--check-invariants``, on in tests) raises after any step that breaks one; in
production the same checks run whenever the engine goes idle and only write receipts, because a
diagnostic must never raise into the loop it observes (law 8).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.config import EngineConfig
from engine.memory.allocator import TokenAllocator
from engine.memory.radix import RadixCache
from engine.observability.receipts import Receipts
from engine.scheduler.admission import running_ceiling
from engine.scheduler.ledger import ledger_violations
from engine.scheduler.memory import Memory
from engine.scheduler.request import Request, State

Violation = tuple[str, dict[str, object]]


class Checked(Protocol):
    """What the checks read of a scheduler (the scheduler itself, structurally)."""

    allocator: TokenAllocator
    cache: RadixCache
    receipts: Receipts
    config: EngineConfig
    requests: dict[str, Request]
    memory: Memory

    @property
    def waiting(self) -> Sequence[Request]: ...
    @property
    def running(self) -> Sequence[Request]: ...


def violations(sched: Checked) -> list[Violation]:
    """Broken invariants, each reported once per kind as a receipt."""
    found = ledger_violations(sched.allocator, sched.cache, sched.memory.holdings.private_tokens())
    found += state_violations(sched)
    for what, numbers in found:
        sched.receipts.violation(what, **numbers)
    return found


def state_violations(sched: Checked) -> list[Violation]:
    """Each request in exactly one of waiting / running, tracked, in a state that matches."""
    out: list[Violation] = []
    waiting = {r.rid for r in sched.waiting}
    running = {r.rid for r in sched.running}
    if (
        len(waiting) != len(sched.waiting)
        or len(running) != len(sched.running)
        or waiting & running
    ):
        both = sorted(waiting & running)
        out.append(
            (
                "request_states",
                {"waiting": len(sched.waiting), "running": len(sched.running), "both": both},
            )
        )
    if waiting | running != set(sched.requests):
        lost = sorted(set(sched.requests) - waiting - running)
        extra = sorted((waiting | running) - set(sched.requests))
        out.append(("request_lost", {"lost": lost, "untracked": extra}))
    for r in sched.waiting:
        if r.state is not State.WAITING or r.row is not None:
            out.append(("waiting_state", {"rid": r.rid, "state": r.state.value}))
    for r in sched.running:
        if r.state not in (State.RUNNING, State.PARKED) or r.row is None:
            out.append(("running_state", {"rid": r.rid, "state": r.state.value}))
    for r in (*sched.waiting, *sched.running):  # a matcher has taken exactly the output so far
        if r.guided is not None and r.guided.accepted != len(r.output_ids):
            numbers = {"rid": r.rid, "accepted": r.guided.accepted, "output": len(r.output_ids)}
            out.append(("grammar_state", numbers))
    ceiling = running_ceiling(sched.config.scheduler.max_running)
    if len(sched.running) > ceiling:
        numbers = {"running": len(sched.running), "max_running": sched.config.scheduler.max_running}
        out.append(("running_ceiling", numbers))
    return out


def audit_idle(sched: Checked) -> None:
    """The idle-time check: receipts only, never an exception into the serving loop."""
    try:
        violations(sched)
    except Exception as e:  # a diagnostic must not raise into what it observes
        sched.receipts.notice("idle_check_failed", f"idle ledger check failed: {e}")


def check(sched: Checked) -> None:
    """Check mode: raise when any invariant is broken."""
    found = violations(sched)
    if found:
        raise AssertionError(f"invariants violated: {found}")
