"""A request's checks run off the event loop within ``--check-timeout``: the loop turns while
they run, and one that overruns is a 503 with Retry-After naming the limit (the checks are
bounded in size, so only load makes them that slow)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from engine.server.errors import ProtocolError
from engine.server.limits import HttpLimits
from engine.server.service import CompletionService


def test_checks_run_off_the_loop_and_one_past_its_deadline_is_a_503_naming_it():
    """A deadline test: the work is held on an event (never done by itself), the limit 0.2 s."""
    service = SimpleNamespace(http=HttpLimits(check_timeout=0.2))
    release = threading.Event()

    async def run() -> tuple[int, ProtocolError]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        try:
            with pytest.raises(ProtocolError) as e:
                await CompletionService.off_loop(service, release.wait, 60)
        finally:
            ticker.cancel()
            release.set()  # the thread ends by itself; here, at once
        return ticks, e.value

    ticks, e = asyncio.run(run())
    assert ticks > 1  # the loop turned while the work held its thread
    assert e.status == 503 and e.headers == {"retry-after": "1"}
    assert "within 0.2 s (--check-timeout)" in str(e)
    answer = asyncio.run(CompletionService.off_loop(service, sum, [1, 2]))
    assert answer == 3
