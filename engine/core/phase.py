"""The phase policy (``--phase-policy auto``): which layout a group of N ranks serves, flipped
while it serves by layout cutovers.

Two layouts: **stages** (tp 1 x pp N: each rank a run of the layers; a batch of many prompts
crosses them in micro-batches, so a prefill-heavy phase takes many prompts at once) and
**shards** (tp N x pp 1: every rank a slice of every layer; a decode step is one pass, no
crossings). Every ``phase_interval`` iterations rank 0 decides from numbers every rank holds
alike (the scheduler's, not a rank's pool): the prefill backlog (prompt tokens not yet
prefilled, each request once: ``census.backlog``), the decode batch (requests that have
generated) and the line. With hysteresis and a minimum dwell, a steady load never churns:

* on shards, the backlog at or above ``phase_enter_pp`` flips to stages;
* on stages, the backlog at or below ``phase_exit_pp`` (below the first) flips back;
* within ``phase_dwell`` iterations of the last flip (or the boot), nothing flips.

Every decision, a flip or not, is a ``phase.decide`` receipt with its numbers and reason. A
flip is a layout cutover in carry mode (``engine/core/cutover.py``), begun and ended at that
boundary; one refused or failed leaves the layout as it was and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from engine.config import EngineConfig
from engine.core.cutover import Cutovers
from engine.model.config import ModelConfig
from engine.model.shard import check_layout
from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.request.messages import Cutover
from engine.scheduler.census import backlog
from engine.scheduler.scheduler import Scheduler

STAGES, SHARDS = "stages", "shards"


@dataclass(frozen=True, slots=True)
class Thresholds:
    enter: int  # backlog at or above which shards flip to stages
    exit: int  # backlog at or below which stages flip back to shards
    dwell: int  # iterations a layout is kept at least


class Flippable(Protocol):
    """What the policy reads of its engine (``EngineCore``, which builds the policy and so
    cannot be imported here) and the cutovers it flips the layout with."""

    config: EngineConfig
    scheduler: Scheduler
    receipts: Receipts
    cutovers: Cutovers


def check_layouts(cfg: ModelConfig, world: int) -> None:
    """Boot: both layouts the policy flips between fit ``cfg`` (a model config) on ``world``
    ranks, or a ValueError naming the one that does not (a flip to it would be refused every
    time the backlog asked for it)."""
    for tp, pp in ((world, 1), (1, world)):
        try:
            check_layout(cfg, tp, pp)
        except ValueError as e:
            raise ValueError(
                f"--phase-policy auto flips between tp {world} x pp 1 and tp 1 x pp {world}; "
                f"this model cannot take tp {tp} x pp {pp}: {e}"
            ) from None


def decide(layout: str, backlog_tokens: int, since: int, t: Thresholds) -> tuple[str, str]:
    """The layout to serve next and why: (layout, reason)."""
    if since < t.dwell:
        return layout, "dwell"
    if layout == SHARDS and backlog_tokens >= t.enter:
        return STAGES, "backlog_high"
    if layout == STAGES and backlog_tokens <= t.exit:
        return SHARDS, "backlog_low"
    return layout, "steady"


class PhasePolicy:
    """Rank 0's policy over ``core`` (an ``EngineCore`` of a group): ``after_step`` once per
    iteration."""

    def __init__(self, core: Flippable) -> None:
        g = core.config.group
        self.core, self.world, self.every = core, g.world, g.phase_interval
        self.thresholds = Thresholds(g.phase_enter_pp, g.phase_exit_pp, g.phase_dwell)
        self.iterations = 0
        self.last_flip = 0  # the iteration of the last flip (the boot counts as one)

    def layout(self) -> str:
        g = self.core.config.group
        return STAGES if g.pp == self.world else SHARDS

    def after_step(self) -> dict[str, Any] | None:
        """Decide at a boundary (every ``phase_interval`` iterations): a ``phase.decide``
        receipt, and on a flip the layout cutover's end fields."""
        self.iterations += 1
        if self.iterations % self.every or self.core.cutovers.active is not None:
            return None
        sched, layout = self.core.scheduler, self.layout()
        since = self.iterations - self.last_flip
        pending = backlog(sched.running, sched.waiting)
        target, reason = decide(layout, pending, since, self.thresholds)
        numbers = {
            "layout": layout,
            "backlog": pending,
            "since": since,
            "decode": sum(1 for r in sched.running if r.output_ids),
            "waiting": len(sched.waiting),
            "free": sched.memory.available(),
            "enter": self.thresholds.enter,
            "exit": self.thresholds.exit,
            "dwell": self.thresholds.dwell,
        }
        if target == layout:
            self.core.receipts.emit(schema.PHASE_DECIDE, decision="stay", reason=reason, **numbers)
            return None
        tp, pp = (1, self.world) if target == STAGES else (self.world, 1)
        end = self.core.cutovers.begin(Cutover(kind="layout", mode="carry", tp=tp, pp=pp))
        assert end is not None  # a carry ends at the boundary it begins at
        flipped = end["outcome"] == "ok"
        if flipped:
            self.last_flip = self.iterations
        self.core.receipts.emit(
            schema.PHASE_DECIDE,
            decision="flip" if flipped else "stay",
            reason=reason,
            to=target,
            cutover=end["id"],
            outcome=end["outcome"],
            **numbers,
        )
        return end
