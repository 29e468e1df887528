"""Retraction, the one actuator that takes running requests back to the front of the line.

Who goes is decided elsewhere (``victims.pick_victims``); this module moves them: each
victim's computed KV goes into the prefix cache (for reuse when it comes back), its row is
freed, and it is requeued ahead of everyone, first victim first. One ``retract`` receipt with
the numbers the choice was made on, then one ``requeue`` per victim.

Where it was asked (``site``) decides what the retraction says about the new-token ratio:
at ``decode`` the running requests needed more tokens than the ratio predicted, so the ratio
rises; at ``park`` (the relief ladder funding a parked chunk) the prediction was not wrong,
it was what left no room, and raising it would only park the next chunk sooner; at
``cutover`` (residents a smaller pool or new weights cannot keep) it says nothing about decode
needs either.
"""

from __future__ import annotations

from typing import Any

from engine.obs import schema
from engine.sched.request import Request, State
from engine.sched.victims import victim_order


def retract(sched: Any, victims: list[Request], need: int, site: str = "decode") -> None:
    """Requeue ``victims`` (running requests of ``sched``) to free ``need`` tokens."""
    running = sched.running
    # who the victims were chosen from: at a park, the decoders only (never a chunk in flight)
    pool = [r for r in running if not r.prefilling] if site == "park" else running
    candidates = [[r.rid, len(r.output_ids), r.prompt_len] for r in victim_order(pool)]
    available, evictable = sched.pool.available_size(), sched.pool.evictable_size()
    decoded = sum(len(r.output_ids) for r in running)
    remaining = sum(r.params.max_tokens - len(r.output_ids) for r in running)
    freed = 0
    for req in victims:
        freed += sched._private_of(req) + req.cached_len
        sched.release(req)
        req.retractions += 1
        req.state = State.WAITING
    old = new = sched.ratio.value
    if site == "decode":
        old, new = sched.ratio.on_retract(decoded, remaining, len(victims))
    # candidates: [rid, generated, prompt_tokens] in retraction order
    sched.receipts.emit(
        schema.RETRACT, rids=[r.rid for r in victims], tokens_freed=freed,
        ratio_old=round(old, 4), ratio_new=round(new, 4), need=need, available=available,
        evictable=evictable, candidates=candidates, running_after=len(running), site=site,
    )  # fmt: skip
    sched.waiting.extendleft(reversed(victims))  # the first victim ends up first in line
    for req in victims:
        sched.receipts.emit(schema.REQUEUE, rid=req.rid, generated=len(req.output_ids))
