"""Proposers: where the text so far ends in an n-gram seen before, propose what followed it.

``NgramIndex`` is prompt lookup over one request's prompt and output (vLLM's ``ngram`` method):
the longest suffix of ``n_max`` down to ``n_min`` tokens that occurred earlier, and up to ``k``
tokens that followed its most recent earlier occurrence. The index is updated as tokens arrive
(each token adds one entry per n-gram size), so a proposal costs ``n_max - n_min + 1`` lookups,
never a scan of the text.

``RecentOutputs`` looks the same way across requests: a bounded store of recent requests'
outputs (tool-call shapes recur across the turns of an agent loop), oldest dropped first once
its tokens pass ``max_tokens``; its size is what a receipt reports.

A ``Proposer`` is what the step asks for drafts: ``PromptLookup`` (``--speculative ngram``) and
``SuffixLookup`` (``--speculative suffix``: the request's own text and recent outputs).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol


class NgramIndex:
    """One token sequence and, per n-gram of ``n_min``..``n_max`` tokens, where it last ended."""

    def __init__(self, n_min: int = 2, n_max: int = 4, tokens: Sequence[int] = ()) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes must be 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> the index just past it
        self._prev: dict[tuple[int, ...], int] = {}  # the text's current suffixes: the one before
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens)
            self._prev = {}
            for n in range(self.n_min, min(self.n_max, end) + 1):
                key = tuple(self.tokens[end - n :])
                if key in self._last:
                    self._prev[key] = self._last[key]
                self._last[key] = end

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest
        suffix seen before; [] when no suffix of ``n_min`` tokens or more was."""
        return self.lookup(k)[1]

    def lookup(self, k: int) -> tuple[int, list[int]]:
        """``propose``'s tokens and the length of the suffix that matched (0: none)."""
        end = len(self.tokens)
        for n in range(min(self.n_max, end), self.n_min - 1, -1):
            start = self._prev.get(tuple(self.tokens[end - n :]))
            if start is not None:  # an earlier end: something followed it
                return n, self.tokens[start : start + k]
        return 0, []


class RecentOutputs:
    """Recent requests' outputs, looked up by the current text's suffix; bounded in tokens."""

    def __init__(self, max_tokens: int = 65536, n_min: int = 3, n_max: int = 6) -> None:
        self.max_tokens, self.n_min, self.n_max = max_tokens, n_min, n_max
        self._outputs: OrderedDict[int, list[int]] = OrderedDict()  # oldest first
        self._where: dict[tuple[int, ...], tuple[int, int]] = {}  # n-gram -> (output, end)
        self._next_id = 0
        self.tokens = 0  # held, the receipted size

    def add(self, output: Sequence[int]) -> None:
        """Remember a finished request's output (its newest n-grams win), dropping the oldest
        outputs past the bound."""
        out = list(output)[-self.max_tokens :]
        if len(out) <= self.n_min:
            return
        oid, self._next_id = self._next_id, self._next_id + 1
        self._outputs[oid] = out
        self.tokens += len(out)
        for gram, end in self._grams(out):
            self._where[gram] = (oid, end)
        while self.tokens > self.max_tokens:
            old, dropped = self._outputs.popitem(last=False)
            self.tokens -= len(dropped)
            for gram, _ in self._grams(dropped):  # those a newer output took stay
                if self._where.get(gram, (None,))[0] == old:
                    del self._where[gram]

    def _grams(self, out: list[int]):
        """(n-gram, the index just past it) for each n-gram of ``out`` that something follows."""
        for end in range(self.n_min, len(out)):
            for n in range(self.n_min, min(self.n_max, end) + 1):
                yield tuple(out[end - n : end]), end

    def propose(self, text: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest suffix of ``text`` in a held output."""
        return self.lookup(text, k)[1]

    def lookup(self, text: Sequence[int], k: int) -> tuple[int, list[int]]:
        """``propose``'s tokens and the length of the suffix that matched (0: none)."""
        for n in range(min(self.n_max, len(text)), self.n_min - 1, -1):
            hit = self._where.get(tuple(text[len(text) - n :]))
            if hit is not None:
                oid, end = hit
                return n, self._outputs[oid][end : end + k]
        return 0, []


class Drafted(Protocol):
    """What a proposer reads of a request: its text, and the prompt-lookup index it keeps."""

    prompt_ids: list[int]
    output_ids: list[int]
    spec: NgramIndex | None


class Proposer(Protocol):
    def propose(self, req: Drafted, k: int) -> list[int]:
        """Up to ``k`` tokens to follow the request's text; [] when it has none to offer."""
        ...

    def finished(self, req: Drafted) -> None:
        """The request ended: what it wrote may be proposed to others."""
        ...


def text_index(req: Drafted) -> NgramIndex:
    """The request's prompt-lookup index, brought up to its output (only the tokens new since
    the last call are indexed: its whole text is never copied per step)."""
    if req.spec is None:
        req.spec = NgramIndex(n_min=3, n_max=5, tokens=req.prompt_ids)
    req.spec.extend(req.output_ids[len(req.spec.tokens) - len(req.prompt_ids) :])
    return req.spec


class PromptLookup:
    """``ngram``: prompt lookup over each request's own prompt and output."""

    def propose(self, req: Drafted, k: int) -> list[int]:
        return text_index(req).propose(k)

    def finished(self, req: Drafted) -> None:
        pass


class SuffixLookup:
    """``suffix``: the request's own text and recent requests' outputs (``RecentOutputs``),
    the longer match winning (its own on a tie)."""

    def __init__(self, max_tokens: int = 65536) -> None:
        self.recent = RecentOutputs(max_tokens)

    def propose(self, req: Drafted, k: int) -> list[int]:
        own = text_index(req)
        n, tokens = own.lookup(k)
        if n < self.recent.n_max:  # a longer match may be among the others' outputs
            m, theirs = self.recent.lookup(own.tokens[-self.recent.n_max :], k)
            if m > n:
                return theirs
        return tokens

    def finished(self, req: Drafted) -> None:
        self.recent.add(req.output_ids)
