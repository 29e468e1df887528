"""A hand-made two-rank boot log with something for every section of `audit report`: the pool
filling and draining, parks, a retraction, evictions, relief rungs (paid, short, raised), the
allocation net, published floors and finished requests with latencies. Its verdicts are mixed
(some FAIL) on purpose: the page draws every colour."""

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
        "iteration", rank, iter=i, running=min(i, 8), waiting=max(0, 20 - i),
        parked=int(i % 3 == 0), token_usage=round(1 - free / CAPACITY, 4), avail=free,
        evictable=evictable, staged=8, cached=cached, ratio=0.7,
    )  # fmt: skip


def _pressure(log: LogText, rank: int) -> None:
    log.park(f"r{rank}-10", rank).r("admission.unpark", rank, rid=f"r{rank}-10", tokens=16)
    log.r("eviction", rank, reason="admission", asked=32, evicted=40, staged=0,
          evictable_before=200, evictable_after=160, available_after=90)  # fmt: skip
    log.r("retract", rank, rids=[f"r{rank}-11"], tokens_freed=60, need=8, available=2,
          evictable=0, ratio_old=0.6, ratio_new=0.7, running_after=3)  # fmt: skip
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
        log.r("boot.pool_sized", rank, path="configured", kv_tokens=CAPACITY + 3,
              bytes_per_token=512, page_size=4)  # fmt: skip
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
                log.finish(f"r{rank}-{n}", rank, ttft_s=0.05 * (n + 1), e2e_s=0.5 + 0.2 * n,
                           queue_s=0.01 * n)  # fmt: skip
        log.ts += 0.5
    for rank in (0, 1):
        log.stop(rank)
    return log.write(path)


def quiet_log(path: Path) -> Path:
    """A boot with no iteration receipt and no request: a report of "no data" sections."""
    return LogText().ready().stop().write(path)
