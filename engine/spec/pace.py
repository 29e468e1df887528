"""Whether drafting pays, per request and per batch.

A verified draft costs a position in the forward whether it is kept or not; a kept one saves a
whole step. So a request's drafts pay while the share of them the model keeps stays above what
a drafted position costs, as a share of a step: ``MIN_RATE``. ``Pace`` keeps a request's share
as an exponentially weighted rate over its verified steps (``WEIGHT`` each); below
``MIN_RATE`` it steps aside for ``cool`` of its steps, then tries again, the pause doubling
each time it turns off again (up to ``MAX_COOL``) and reset once a try pays.

A batch of more than ``MAX_BATCH`` decoding requests drafts for none: a forward that many rows
wide is no longer paid for by reading the weights once, and extra positions cost what whole
steps do.

The numbers are first estimates (a drafted position costing about a quarter of a step on
this CPU), to be replaced by what ``bench/speculation.py`` measures.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_RATE = 0.25
WEIGHT = 0.5
FIRST_COOL, MAX_COOL = 8, 256
MAX_BATCH = 8


@dataclass(slots=True)
class Pace:
    rate: float = 1.0  # the weighted share of its drafts the model kept (optimistic at first)
    off_for: int = 0  # its steps left without drafts
    cool: int = FIRST_COOL  # the next pause, in its steps

    def verified(self, proposed: int, kept: int) -> bool:
        """Count one verification; True when the request now steps aside."""
        self.rate += WEIGHT * (kept / proposed - self.rate)
        if self.rate >= MIN_RATE:
            self.cool = FIRST_COOL if self.rate >= 2 * MIN_RATE else self.cool
            return False
        self.off_for, self.cool = self.cool, min(2 * self.cool, MAX_COOL)
        return True

    def waited(self) -> bool:
        """Count one step of its pause; True when the pause is over (drafts again, the rate
        starting where it turns off plus one good try)."""
        self.off_for -= 1
        if self.off_for:
            return False
        self.rate = 2 * MIN_RATE
        return True
