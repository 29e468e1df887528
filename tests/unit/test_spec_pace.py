"""Pace: a request whose drafts the model keeps goes on drafting; one whose drafts it refuses
steps aside for a pause that doubles each time it turns off again, up to a bound, and is reset
once a try pays."""

from __future__ import annotations

from engine.speculative.pace import COST, FIRST_COOL, MAX_COOL, Pace, min_rate


def pause(pace: Pace) -> int:
    steps = 0
    while not pace.waited():
        steps += 1
    return steps + 1


def test_kept_drafts_keep_it_drafting():
    pace = Pace()
    assert not any(pace.verified(4, 3) for _ in range(100))
    assert pace.rate > 2 * min_rate(1) and pace.off_for == 0


def test_refused_drafts_turn_it_off_for_a_pause_that_doubles_up_to_its_bound():
    pace = Pace()
    pauses = []
    for _ in range(8):
        while not pace.verified(4, 0):
            pass
        pauses.append(pause(pace))
    assert pauses[0] == FIRST_COOL and pauses[1] == 2 * FIRST_COOL
    assert pauses[-1] == MAX_COOL and all(b >= a for a, b in zip(pauses, pauses[1:]))


def test_a_try_that_pays_resets_the_pause():
    pace = Pace()
    for _ in range(3):
        while not pace.verified(4, 0):
            pass
        pause(pace)
    assert pace.cool > FIRST_COOL
    pace.verified(4, 4)
    assert pace.cool == FIRST_COOL


def test_a_request_off_since_one_bad_try_is_not_off_forever():
    pace = Pace()
    while not pace.verified(2, 0):
        pass
    assert pace.off_for == FIRST_COOL
    assert pause(pace) == FIRST_COOL and pace.off_for == 0 and pace.rate >= min_rate(1)


def test_a_wider_batch_asks_more_of_the_drafts():
    """A drafted position costs more of a step in a wider batch (measured: pace.COST)."""
    assert [min_rate(b) for b in (1, 2, 4, 5, 8, 16)] == [
        COST[0][1],
        COST[1][1],
        COST[1][1],
        COST[2][1],
        COST[2][1],
        COST[3][1],
    ]
    kept_a_third = Pace(rate=1 / 3)
    assert not kept_a_third.verified(3, 1, batch=1)  # pays alone
    assert kept_a_third.verified(3, 1, batch=16)  # not in a batch of 16
