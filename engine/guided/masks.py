"""A constrained request's grammar state (``Guided``) and the token masks of a step (``Masks``).

The mask of a request depends only on the tokens it has accepted, all known before the forward:
``begin`` fills the batch's bitmask on a worker thread while the forward runs, ``apply`` waits
for it and sets the forbidden tokens of each constrained row to -inf before the sampler reads
them (penalties and bias then leave -inf where it is). A batch without a constrained request
costs nothing: no thread, no bitmask.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from engine.request.guide import Guide


@dataclass(slots=True)
class Guided:
    """One request's matcher over its guide's grammar; ``accepted``: the tokens it has taken,
    always the request's output so far (a retracted request keeps its output, and so its
    matcher's state; the invariant checks compare the two)."""

    guide: Guide
    matcher: Any  # xgrammar.GrammarMatcher
    banned: torch.Tensor | None = None  # tokens never allowed, whatever the grammar says
    accepted: int = 0

    @classmethod
    def of(cls, guide: Guide, grammar: Any, banned: torch.Tensor | None = None) -> Guided:
        import xgrammar as xgr

        return cls(guide, xgr.GrammarMatcher(grammar), banned)

    def accept(self, tid: int) -> bool:
        """Advance over a sampled token; False when the grammar forbids it."""
        ok = bool(self.matcher.accept_token(tid))
        self.accepted += ok
        return ok


@dataclass(slots=True)
class Fill:
    """A step's bitmask being filled: ``rows`` of the sampled batch are constrained."""

    rows: list[int]
    bitmask: torch.Tensor
    future: Future
    banned: list[torch.Tensor | None]  # each constrained row's banned tokens


class Masks:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._bitmask: torch.Tensor | None = None
        self._worker: ThreadPoolExecutor | None = None
        # since the last iteration receipt: steps with a constrained row, and their mask time
        self.steps = 0
        self.seconds = 0.0

    def begin(self, guided: Sequence[Guided | None]) -> Fill | None:
        """Start filling the masks of the constrained rows of ``guided`` (one entry per sampled
        row); None when no row is constrained."""
        rows = [i for i, g in enumerate(guided) if g is not None]
        if not rows:
            return None
        bitmask = self._buffer(len(guided))
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        matchers = [guided[i].matcher for i in rows]  # type: ignore[union-attr]
        future = self._worker.submit(_fill, matchers, rows, bitmask)
        return Fill(rows, bitmask, future, [guided[i].banned for i in rows])  # type: ignore[union-attr]

    def apply(self, fill: Fill, logits: torch.Tensor) -> None:
        """Wait for ``fill`` and mask ``logits`` (the sampled rows, fp32 on the host) in place."""
        import xgrammar as xgr

        t0 = time.perf_counter()
        filled_s = fill.future.result()
        xgr.apply_token_bitmask_inplace(
            logits, fill.bitmask[: logits.shape[0]], vocab_size=self.vocab_size, indices=fill.rows
        )
        for row, banned in zip(fill.rows, fill.banned):
            _ban(logits[row], banned)
        self.steps += 1
        self.seconds += filled_s + time.perf_counter() - t0

    def draft_rows(self, g: Guided, drafts: Sequence[int], rows: torch.Tensor) -> int:
        """Mask a drafted request's ``rows`` (row i: the token after its text and drafts[:i])
        as its grammar allows, the matcher walked over the drafts and walked back; the number
        of drafts the grammar takes (rows past the first it refuses are left alone: the
        refused draft's row is the last one read; after a draft that ends the grammar, none
        is: the request ends on it). Not overlapped with the forward: the masks depend on the
        drafts."""
        import xgrammar as xgr

        if not rows.is_contiguous():  # xgrammar's CPU kernel would mask a copy, silently
            raise ValueError("draft rows must be contiguous to be masked in place")
        t0 = time.perf_counter()
        bitmask = self._buffer(len(drafts) + 1)
        filled = taken = 0
        for i in range(len(drafts) + 1):
            if g.matcher.is_terminated():
                break
            g.matcher.fill_next_token_bitmask(bitmask, i)
            filled += 1
            if i == len(drafts) or not g.matcher.accept_token(drafts[i]):
                break
            taken += 1
        if taken:
            g.matcher.rollback(taken)
        xgr.apply_token_bitmask_inplace(rows[:filled], bitmask[:filled], vocab_size=self.vocab_size)
        _ban(rows[:filled], g.banned)
        self.steps += 1
        self.seconds += time.perf_counter() - t0
        return taken

    def take_ms(self) -> float | None:
        """The mean mask time per constrained step since the last call, in ms (None: none)."""
        if not self.steps:
            return None
        ms = self.seconds / self.steps * 1e3
        self.steps, self.seconds = 0, 0.0
        return ms

    def _buffer(self, rows: int) -> torch.Tensor:
        if self._bitmask is None or self._bitmask.shape[0] < rows:
            import xgrammar as xgr

            self._bitmask = xgr.allocate_token_bitmask(max(rows, 8), self.vocab_size)
        return self._bitmask


def _ban(rows: torch.Tensor, banned: torch.Tensor | None) -> None:
    """Tokens never allowed, whatever the grammar says, set to -inf in ``rows`` (a view)."""
    if banned is not None:
        rows[..., banned] = float("-inf")


def _fill(matchers: list[Any], rows: list[int], bitmask: torch.Tensor) -> float:
    t0 = time.perf_counter()
    for m, i in zip(matchers, rows):
        m.fill_next_token_bitmask(bitmask, i)
    return time.perf_counter() - t0
