"""GroupView: what the ranks of a group agreed on this iteration.

Decisions that must agree across ranks read the *published floor* (the MIN over ranks of
available + evictable tokens, reduced once per iteration before any branch), never one rank's
own pool alone. "No floor was published" (None) and "the floor is zero" (0) are different
states: the first leaves the local budget untouched, the second binds.
"""

from __future__ import annotations


class GroupView:
    """One rank alone: it publishes no floor, so the local budget decides."""

    def published_floor(self) -> int | None:
        """The floor every rank decides from this iteration, or None when none was published.

        An extension point that only tests use today (``FixedFloor``): with one rank nothing is
        reduced, so None. Multi-rank serving overrides it with the all-reduced MIN."""
        return None


class FixedFloor(GroupView):
    """A floor set from outside (tests, or a group whose reduce happens elsewhere)."""

    def __init__(self, floor: int | None) -> None:
        self.floor = floor

    def published_floor(self) -> int | None:
        return self.floor
