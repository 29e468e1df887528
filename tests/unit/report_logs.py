"""A hand-made two-rank boot log with something for every section of `audit report`: the pool
filling and draining, parks, a retraction, evictions, relief rungs (paid, short, raised), the
allocation net, published floors, progress counters and finished requests with latencies. Its
verdicts are mixed (some FAIL) on purpose: the page draws every colour. And a 40 s boot whose
iterations are sampled, for the receipts that speak between them."""

from __future__ import annotations

from pathlib import Path

from tests.unit.audit_logs import LogText

CAPACITY = 1024  # per rank; page_size 4 divides it
REQUESTS = 12  # per rank


def _iteration(log: LogText, rank: int, i: int) -> None:
    cached = min(40 * i, 400)
    evictable = cached // 2
    used = min(30 * i, 500) if i < 40 else max(0, 500 - 40 * (i - 40))
    free = CAPACITY - used - cached - 8
    log.r(
        "iteration",
        rank,
        iter=i,
        running=min(i, 8),
        waiting=max(0, 20 - i),
        parked=int(i % 3 == 0),
        token_usage=round(1 - free / CAPACITY, 4),
        avail=free,
        evictable=evictable,
        staged=8,
        cached=cached,
        ratio=0.7,
        tokens_generated=6 * i,
        admissions=min(i + 1, REQUESTS),
        requests_ended=min(max(0, i - 20), REQUESTS),
    )


def _pressure(log: LogText, rank: int) -> None:
    log.park(f"r{rank}-10", rank).r("admission.unpark", rank, rid=f"r{rank}-10", tokens=16)
    log.r(
        "eviction",
        rank,
        reason="admission",
        asked=32,
        evicted=40,
        staged=0,
        evictable_before=200,
        evictable_after=160,
        available_after=90,
    )
    log.r(
        "retract",
        rank,
        rids=[f"r{rank}-11"],
        tokens_freed=60,
        need=8,
        available=2,
        evictable=0,
        ratio_old=0.6,
        ratio_new=0.7,
        running_after=3,
    )
    log.r("requeue", rank, rid=f"r{rank}-11", generated=4)
    log.r("alloc.flush", rank, need=8, staged=8, freed=8, site="decode", rid=f"r{rank}-6")
    log.r("relief.engage", rank, shortfall=24, rungs=3)
    for rung, paid, outcome in (
        ("evict", 8, "short"),
        ("spill", 0, "raised"),
        ("park", 16, "paid"),
    ):
        log.r("relief.rung", rank, rung=rung, asked=24, paid=paid, outcome=outcome)
    log.r("alloc.retry", rank, need=8, ok=True)


def busy_log(path: Path) -> Path:
    """Two ranks, one boot: pool, events, floors and latencies for every section."""
    log = LogText()
    for rank in (0, 1):
        log.ready(rank)
        log.r(
            "boot.pool_sized",
            rank,
            path="configured",
            kv_tokens=CAPACITY + 3,
            bytes_per_token=512,
            page_size=4,
        )
    for i in range(60):
        for rank in (0, 1):
            if i < REQUESTS:
                log.received(f"r{rank}-{i}", rank)
            _iteration(log, rank, i)
            log.r("group.floor", rank, floor=200 - i, local=220 - i + 10 * rank)
            if i == 30:
                _pressure(log, rank)
            if 20 <= i < 20 + REQUESTS:
                n = i - 20
                log.finish(
                    f"r{rank}-{n}",
                    rank,
                    ttft_s=0.05 * (n + 1),
                    e2e_s=0.5 + 0.2 * n,
                    queue_s=0.01 * n,
                )
        log.ts += 0.5
    for rank in (0, 1):
        log.stop(rank)
    return log.write(path)


def quiet_log(path: Path) -> Path:
    """A boot with no iteration receipt and no request: a report of "no data" sections."""
    return LogText().ready().stop().write(path)


SPARSE_T0 = 1000.0  # boot.start's ts in sparse_boot_log
SPARSE_ITERATIONS = (23.0, 28.0, 33.0, 38.0)  # seconds after boot: one every 50 steps


def sparse_boot_log(path: Path, tp: int = 1) -> Path:
    """A 40 s boot of one rank whose ``iteration`` receipts are sampled (every 50 steps: four,
    the first 23 s in): the first seconds speak only through admissions, defers, a stall, a
    retraction, an eviction and the throttle, as a slow engine under pressure writes them.
    ``tp``: what ``boot.start`` declares (its eviction then counts the rank's own pool)."""
    log = LogText()
    at = lambda s: SPARSE_T0 + s  # noqa: E731
    budget = dict(decode_reserve=16, floor=None, offset=0)
    log.r("boot.start", ts=at(0.0), config={"kv_tokens": 4096, "tp": tp})
    log.r(
        "boot.pool_sized",
        ts=at(0.1),
        path="configured",
        kv_tokens=4096,
        bytes_per_token=512,
        page_size=16,
    )
    log.r("boot.ready", ts=at(0.2), startup_s=0.2)
    for i in range(6):
        log.received(f"r-{i}", ts=at(0.5 + 0.1 * i))
    for i, evictable in enumerate((0, 32)):
        log.r(
            "admission.admit",
            ts=at(1.0 + i),
            iter=1 + i,
            rid=f"r-{i}",
            tokens=512,
            pages=32,
            prefix_hit=0,
            held=0,
            chunked=False,
            retracted=0,
            local_avail=3000 - 600 * i,
            evictable=evictable,
            remaining=2500 - 600 * i,
            **budget,
        )
    log.r(
        "admission.defer",
        ts=at(3.0),
        iter=3,
        count=4,
        reason="budget",
        running=3,
        step_budget=None,
        local_avail=40,
        evictable=48,
        remaining=0,
        **budget,
    )
    # the in-flight chunk held by the step budget: its count is that chunk, not the line
    log.r(
        "admission.defer",
        ts=at(4.0),
        iter=4,
        count=1,
        reason="step_budget",
        rid="r-1",
        running=3,
        step_budget=0,
        local_avail=40,
        evictable=48,
        remaining=0,
        **budget,
    )
    log.r(
        "scheduler.stall",
        ts=at(12.0),
        iter=4,
        since=at(5.0),
        limit_s=5.0,
        running=2,
        waiting=4,
        parked=1,
    )
    log.received("r-6", ts=at(12.01), arrived=at(8.0))
    log.r("scheduler.resume", ts=at(12.02), iter=4, stalled_s=7.0, arrived=1)
    log.r(
        "retract",
        ts=at(14.0),
        iter=5,
        rids=["r-1"],
        tokens_freed=600,
        need=64,
        available=16,
        evictable=0,
        candidates=[["r-1", 3, 512]],
        ratio_old=0.5,
        ratio_new=0.6,
        running_after=1,
        site="decode",
    )
    log.r("requeue", ts=at(14.01), iter=5, rid="r-1", generated=3)
    log.r(
        "relief.throttle",
        ts=at(15.0),
        iter=6,
        iterations=8,
        until=14,
        running=2,
        waiting=5,
        site="decode",
    )
    log.r(
        "eviction",
        ts=at(16.0),
        iter=7,
        reason="decode",
        asked=64,
        evicted=80,
        staged=16,
        evictable_before=80,
        evictable_after=0,
        available_after=96,
    )
    for n, s in enumerate(SPARSE_ITERATIONS, start=1):
        log.r(
            "iteration",
            ts=at(s),
            iter=50 * n,
            running=3,
            waiting=3 - n // 2,
            parked=0,
            token_usage=0.5,
            avail=2000 + 10 * n,
            evictable=64,
            staged=0,
            cached=128,
            ratio=0.6,
            tokens_generated=40 * n,
            admissions=2 + n,
            requests_ended=n - 1,
        )
    log.r(
        "scheduler.stall",
        ts=at(39.5),
        iter=200,
        since=at(38.5),
        limit_s=0.5,
        running=3,
        waiting=1,
        parked=0,
    )
    log.r("boot.stop", ts=at(40.0), iter=200, reason="test", in_flight=0)
    return log.write(path)


# The figures `audit report` draws for ``busy_log``, in page order (their div ids).
FIGURES = [
    "fig-pool-0",
    "fig-pool-1",
    "fig-timeline",
    "fig-queue",
    "fig-progress",
    "fig-latency",
    "fig-floors",
]
