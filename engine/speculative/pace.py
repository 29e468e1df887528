"""Whether drafting pays, per request and per batch.

A verified draft costs a position in the forward whether it is kept or not; a kept one saves a
whole step. So a request's drafts pay while the share of them the model keeps stays above what
a drafted position costs, as a share of a step: ``min_rate(batch)``. ``Pace`` keeps a request's
share as an exponentially weighted rate over its verified steps (``WEIGHT`` each); below the
batch's threshold it steps aside for ``cool`` of its steps, then tries again, the pause doubling
each time it turns off again (up to ``MAX_COOL``) and reset once a try pays.

The thresholds are measured: ``bench/speculation.py --cost`` times the default model's decode
step with 4 refused drafts per request against none (BENCHMARKS.md, "Speculative decoding"). On
a 2-core AVX-512 EPYC, exact mode, a drafted position cost 0.295 of a step at batch 1, 0.321 at
4, 0.352 at 8 and 0.426 at 16 (the step is compute-bound once it carries several positions per
row). ``COST`` holds those, rounded up; between two measured sizes the larger one's applies. A
batch of more than ``MAX_BATCH`` decoding requests (none measured) drafts for none. Since drafted
rows are attended by the native decode kernel (no gather per layer) a position measured 0.02 to
0.21 of a step at batches 1 to 16, in two runs that disagree by up to 2x; the older, higher
thresholds stay: a request steps aside earlier than it must, never later."""

from __future__ import annotations

from dataclasses import dataclass

COST = ((1, 0.30), (4, 0.33), (8, 0.36), (16, 0.43))  # (batch size, share of a step)
MAX_BATCH = COST[-1][0]
WEIGHT = 0.5
FIRST_COOL, MAX_COOL = 8, 256


def min_rate(batch: int) -> float:
    """The share of drafts kept below which drafting costs more than it saves at ``batch``."""
    return next(cost for size, cost in COST if batch <= size)


@dataclass(slots=True)
class Pace:
    rate: float = 2 * COST[0][1]  # the weighted share of its drafts the model kept
    off_for: int = 0  # its steps left without drafts (-1: none ever again)
    cool: int = FIRST_COOL  # the next pause, in its steps

    def drafts(self, k: int) -> int:
        """How many drafts to verify, of at most ``k``: as many as its rate says will be kept,
        and one more (a refused draft costs a position; a request that keeps most gets k)."""
        return max(1, min(k, round(self.rate * k) + 1))

    def verified(self, proposed: int, kept: int, batch: int = 1) -> bool:
        """Count one verification in a batch of ``batch`` decodes; True when the request now
        steps aside."""
        floor = min_rate(batch)
        self.rate += WEIGHT * (kept / proposed - self.rate)
        if self.rate >= floor:
            self.cool = FIRST_COOL if self.rate >= 2 * floor else self.cool
            return False
        self.off_for, self.cool = self.cool, min(2 * self.cool, MAX_COOL)
        return True

    def stop(self) -> None:
        """Never draft for it again (its answer must not depend on drafts): ``off_for`` -1."""
        self.off_for = -1

    def waited(self) -> bool:
        """Count one step of its pause; True when the pause is over (drafts again, the rate
        starting at the batch-of-one threshold's double: one poor try does not end it)."""
        if self.off_for < 0:  # stopped for good
            return False
        self.off_for -= 1
        if self.off_for:
            return False
        self.rate = 2 * COST[0][1]
        return True
