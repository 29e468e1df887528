"""A job's choices end once each, for a stated reason, and /metrics counts those endings the way
the scheduler's receipts do: a failed choice aborts its siblings as ``sibling_failed`` (never as
a client that went away), the deadline aborts as ``deadline``, and an abort that loses the race
with a normal ending counts as that ending."""

from __future__ import annotations

import asyncio

import pytest

from engine.observability.metrics import ServerMetrics
from engine.request.messages import PoolSnapshot, StepOutput
from engine.request.sampling_params import SEED_MAX, SEED_MIN, SamplingParams
from engine.server.job import Job, JobFailed, choice_params


class FakeScheduler:
    """Takes submissions and aborts as the driver would send them; answers an abort of a
    request it holds with its final output, as ``Scheduler.abort`` does, and counts the
    receipts that would be written."""

    def __init__(self, refuse: set[int] = frozenset(), fail_at: int | None = None) -> None:
        self.subs: dict[str, object] = {}
        self.taken = 0
        self.aborts: list[tuple[str, str]] = []
        self.receipts = {"request.abort": 0, "request.finish": 0}
        self.refuse, self.fail_at = refuse, fail_at
        self.stopping = self.dead = None

    def submit(self, sub, trace=None) -> None:
        if self.taken == self.fail_at:
            raise RuntimeError("scheduler is not running: gone")
        self.taken += 1
        if self.taken - 1 in self.refuse:
            sub.loop.call_soon(sub.out.put_nowait, ValueError("refused"))
        else:
            self.subs[sub.rid] = sub

    def abort(self, rid: str, reason: str = "client_disconnect") -> None:
        self.aborts.append((rid, reason))
        sub = self.subs.pop(rid, None)
        if sub is not None:
            self.receipts["request.abort"] += 1
            sub.loop.call_soon(sub.out.put_nowait, final(rid, "abort"))

    def finish(self, rid: str, reason: str = "length") -> None:
        """The request ends in the scheduler; its final output reaches the job a moment later
        (it is on its way through the pipe)."""
        sub = self.subs.pop(rid)
        self.receipts["request.finish"] += 1
        sub.loop.call_soon(sub.out.put_nowait, final(rid, reason))


def final(rid: str, reason: str) -> StepOutput:
    return StepOutput(
        rid=rid, new_token_ids=[1], text_delta="x", finished=True, finish_reason=reason
    )


def endings(metrics: ServerMetrics) -> dict[str, float]:
    out = {}
    for line in metrics.render().decode().splitlines():
        if line.startswith("attest:requests_total{"):
            name, value = line.rsplit(" ", 1)
            out[name.split('"')[1]] = float(value)
    return out


def make_job(sched, n, deadline_s=None):
    metrics = ServerMetrics(lambda: PoolSnapshot())
    params = SamplingParams(max_tokens=4, seed=7)
    job = Job(sched, metrics, "cmpl-x", [1, 2], params, n, 0, deadline_s)
    job.deadline = None if deadline_s is None else asyncio.get_running_loop().time() + deadline_s
    return job, metrics


async def drain(job):
    async def read():
        return [(i, out.finish_reason) async for i, out in job.events()]

    return await asyncio.wait_for(read(), 5)  # a job that never ends fails here, not hangs


def test_a_refused_choice_aborts_its_siblings_and_metrics_count_what_receipts_count():
    async def run():
        sched = FakeScheduler(refuse={1})
        job, metrics = make_job(sched, 3)
        job.submit()
        with pytest.raises(JobFailed) as e:
            await drain(job)
        assert e.value.status == 400
        await asyncio.sleep(0)  # the aborts' own outputs arrive
        await asyncio.sleep(0)
        return sched, job, metrics

    sched, job, metrics = asyncio.run(run())
    assert sorted(sched.aborts) == [("cmpl-x-0", "sibling_failed"), ("cmpl-x-2", "sibling_failed")]
    assert endings(metrics) == {"abort": sched.receipts["request.abort"], "rejected": 1}
    job.close()  # closing again (the response's finally) asks for nothing more
    assert len(sched.aborts) == 2


def test_the_deadline_aborts_as_deadline_and_answers_504():
    async def run():
        sched = FakeScheduler()
        job, metrics = make_job(sched, 2, deadline_s=0.05)
        job.submit()
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(JobFailed) as e:
            await drain(job)
        waited = asyncio.get_running_loop().time() - t0
        await asyncio.sleep(0)
        return sched, metrics, e.value, waited

    sched, metrics, err, waited = asyncio.run(run())
    assert err.status == 504 and "deadline of 0.05 s" in str(err)
    assert 0.04 < waited < 30  # no hang; the lower bound is the deadline itself
    assert sorted(sched.aborts) == [("cmpl-x-0", "deadline"), ("cmpl-x-1", "deadline")]
    assert endings(metrics) == {"abort": 2.0} == {"abort": sched.receipts["request.abort"]}


def test_an_abort_the_client_did_not_ask_for_is_an_error_never_a_200():
    async def run():
        sched = FakeScheduler()
        job, metrics = make_job(sched, 2)
        job.submit()
        sub = sched.subs.pop("cmpl-x-0")  # the engine ends it: nobody asked
        ended = StepOutput(
            rid="cmpl-x-0",
            new_token_ids=[],
            text_delta="",
            finished=True,
            finish_reason="abort",
            abort_reason="exceeds_pool",
        )
        sub.loop.call_soon(sub.out.put_nowait, ended)
        with pytest.raises(JobFailed) as e:
            await drain(job)
        await asyncio.sleep(0)
        return sched, e.value

    sched, err = asyncio.run(run())
    assert err.status == 500 and "(exceeds_pool)" in str(err)
    assert sched.aborts == [("cmpl-x-1", "sibling_failed")]


def test_an_abort_that_loses_the_race_counts_as_the_ending_that_won():
    async def run():
        sched = FakeScheduler()
        job, metrics = make_job(sched, 2)
        job.submit()
        sched.finish("cmpl-x-0", "stop")  # in the pipe when the abort is sent
        job.close()  # the client went away
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return sched, metrics

    sched, metrics = asyncio.run(run())
    assert sorted(sched.aborts) == [
        ("cmpl-x-0", "client_disconnect"),
        ("cmpl-x-1", "client_disconnect"),
    ]
    assert endings(metrics) == {"stop": 1.0, "abort": 1.0}
    assert sched.receipts == {"request.abort": 1, "request.finish": 1}


def test_a_submission_that_fails_midway_aborts_what_was_taken_and_counts_the_rest_as_errors():
    async def run():
        sched = FakeScheduler(fail_at=1)
        job, metrics = make_job(sched, 3)
        with pytest.raises(JobFailed) as e:
            job.submit()
        await asyncio.sleep(0)
        return sched, metrics, e.value

    sched, metrics, err = asyncio.run(run())
    assert err.status == 503
    assert sched.aborts == [("cmpl-x-0", "sibling_failed")]
    assert endings(metrics) == {"abort": 1.0, "error": 2.0}


def test_choices_lost_with_a_dead_scheduler_count_as_the_aborts_written_for_them():
    async def run():
        sched = FakeScheduler()
        job, metrics = make_job(sched, 2)
        job.submit()
        sched.dead = "scheduler process was killed by SIGKILL"  # then the driver fails them all
        for sub in sched.subs.values():
            sub.out.put_nowait(RuntimeError("scheduler failed"))
        with pytest.raises(JobFailed) as e:
            await drain(job)
        return metrics, e.value

    metrics, err = asyncio.run(run())
    assert err.status == 503
    assert endings(metrics) == {"abort": 2.0}  # one request.abort (scheduler_died) each


def test_choice_seeds_wrap_into_the_signed_64_bit_range():
    top = SamplingParams(seed=SEED_MAX)
    assert choice_params(top, 0).seed == SEED_MAX
    assert choice_params(top, 1).seed == SEED_MIN
    assert choice_params(SamplingParams(seed=7), 2).seed == 9
