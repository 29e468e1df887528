"""The serve loop's watch on itself: a turn that comes more than the limit after the one before
is a stall, with the wall time of the last turn before it; turns within the limit are not."""

from __future__ import annotations

from engine.server.stall import Stall, StallWatch


class Clocks:
    def __init__(self) -> None:
        self.mono, self.wall = 100.0, 1_700_000_000.0

    def advance(self, s: float) -> None:
        self.mono += s
        self.wall += s


def test_a_turn_past_the_limit_is_a_stall_from_the_last_turn_before_it():
    c = Clocks()
    watch = StallWatch(10.0, clock=lambda: c.mono, wall=lambda: c.wall)
    turns = []
    for gap in (0.5, 9.9, 0.5, 37.25, 0.5):
        c.advance(gap)
        turns.append(watch.turn())
    assert turns[:3] == [None, None, None] and turns[4] is None
    since = 1_700_000_000.0 + 0.5 + 9.9 + 0.5
    assert turns[3] == Stall(seconds=37.25, since=since, seen=since + 37.25)
