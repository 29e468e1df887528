"""Job: one HTTP request's choices in the scheduler, from submission to the last output.

A request for ``n`` choices is ``n`` scheduler requests sharing one queue. Each output is counted
as it arrives (tokens, timings, the choice's ending), whether or not anyone still reads it, so
/metrics counts each choice's ending once, the way its receipt does: ``stop`` and ``length`` as
``request.finish``, ``abort`` as ``request.abort`` (the frontend writes those of a scheduler that
died), ``rejected`` as the scheduler's refusal, and ``error`` for a choice the scheduler never
took, which has no receipt. The job yields each
output with its choice index, ends the request's server span, and aborts whatever has not
finished when it is closed, saying why: the client went away, the deadline passed, or another
choice of the same request failed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from engine.observability import schema
from engine.observability import tracing as tr
from engine.observability.metrics import ServerMetrics
from engine.request.messages import StepOutput
from engine.request.sampling_params import SEED_MIN, SamplingParams
from engine.server.driver import EngineDriver, Submission

# why the frontend aborts a choice (the request.abort receipt's reason)
CLIENT_DISCONNECT, DEADLINE, SIBLING_FAILED = schema.FRONTEND_ABORTS


class JobFailed(Exception):
    """A request that cannot complete: the scheduler refused it, died, or is stopping, or the
    request ran past its deadline."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Inbox:
    """One choice's inbox as the driver sees it (``put_nowait``, on the event loop): the job
    counts the output, then queues it for its reader tagged with the choice's index."""

    __slots__ = ("job", "i")

    def __init__(self, job: Job, i: int) -> None:
        self.job, self.i = job, i

    def put_nowait(self, item: object) -> None:
        self.job._arrived(self.i, item)


class Job:
    """One HTTP request in the scheduler; ``t0_ns`` is its arrival (wall clock), from which
    ``deadline_s`` (None: no deadline) counts."""

    def __init__(
        self,
        driver: EngineDriver,
        metrics: ServerMetrics,
        rid: str,
        ids: list[int],
        params: SamplingParams,
        n: int,
        t0_ns: int,
        deadline_s: float | None = None,
        api: str | None = None,
        report_metrics: bool = False,
    ) -> None:
        self.driver = driver
        self.rid = rid
        self.queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.rids = [rid] if n == 1 else [f"{rid}-{i}" for i in range(n)]
        self.subs = [
            # several seeded choices must still differ: each draws from its own seed
            Submission(r, ids, choice_params(params, i), loop, _Inbox(self, i), t0_ns / 1e9, api)
            for i, r in enumerate(self.rids)
        ]
        self.index = {r: i for i, r in enumerate(self.rids)}
        self.open = set(self.rids)  # no ending has arrived yet
        self.asked: set[str] = set()  # asked to abort
        self.unread = n  # endings not yet read by events()
        self.deadline_s = deadline_s
        waited = (time.time_ns() - t0_ns) / 1e9
        self.deadline = None if deadline_s is None else loop.time() + deadline_s - waited
        # time to first token counts from the request's arrival (t0_ns), for /metrics and spans
        self.started_ns = t0_ns
        self.timers = [metrics.timer(len(ids) if i == 0 else 0, t0_ns, api) for i in range(n)]
        self.completion = [0] * n
        self.cached = 0
        self.prompt_tokens = len(ids)
        self.reasons: list[str | None] = [None] * n
        self.parks = self.retractions = 0
        # each choice's ending timings, as its request.finish receipt has them
        self.timings: list[Mapping[str, float | None] | None] = [None] * n
        self.report_metrics = report_metrics  # the answer carries metrics() (the flag's)
        self.trace: str | None = None  # the traceparent the scheduler's spans go under
        self.span: Any = None  # the HTTP server span (tracing on)

    def submit(self) -> None:
        for k, sub in enumerate(self.subs):
            try:
                self.driver.submit(sub, self.trace)
            except RuntimeError as e:
                for i in range(k, len(self.subs)):  # never reached the scheduler
                    self._ended(i, "error")
                self.close(SIBLING_FAILED)
                raise JobFailed(str(e), 503) from e

    def _arrived(self, i: int, item: object) -> None:
        """Count one output of choice ``i`` (read or not), then queue it for events()."""
        if isinstance(item, StepOutput):
            n_new = len(item.new_token_ids)
            self.timers[i].tokens(n_new, item.cached_tokens)
            self.completion[i] += n_new
            self.cached = max(self.cached, item.cached_tokens)
            if item.finished:
                self.reasons[i] = item.finish_reason
                self.timings[i] = item.timing
                self.parks += item.parks
                self.retractions += item.retractions
                self._ended(i, item.finish_reason or "abort")
        elif isinstance(item, ValueError):  # the scheduler refused it
            self._ended(i, "rejected")
        else:  # the scheduler died (each is then a request.abort the frontend writes) or stopped
            self._ended(i, "abort" if self.driver.dead else "error")
        self.queue.put_nowait((i, item))

    def _ended(self, i: int, how: str) -> None:
        if self.rids[i] in self.open:
            self.open.discard(self.rids[i])
            self.timers[i].end(how)

    def answered(self, i: int, reason: str | None) -> None:
        """Choice ``i`` ended, as the client was told (``tool_calls`` where the scheduler said
        ``stop``): the reason the span reports."""
        self.reasons[i] = reason

    async def events(self) -> AsyncIterator[tuple[int, StepOutput]]:
        """Each output with its choice's index, until every choice has ended. A failed choice
        aborts the others (``sibling_failed``) and raises JobFailed; so does the deadline."""
        while self.unread:
            i, item = await self._next()
            if isinstance(item, Exception):
                self.unread -= 1
                self.close(SIBLING_FAILED)
                raise JobFailed(str(item), 400 if isinstance(item, ValueError) else 503)
            if item.finished:
                self.unread -= 1
                if item.finish_reason == "abort":
                    self._engine_ended(i, item)
            yield i, item

    def _engine_ended(self, i: int, item: StepOutput) -> None:
        """A choice aborted that the client did not ask to end: never a 200. The others are
        aborted with it and the client gets an error (an error event on a stream)."""
        if self.rids[i] in self.asked and not self.driver.stopping:
            return  # the frontend's own abort (deadline, sibling): its error is said elsewhere
        self.close(SIBLING_FAILED)
        if self.driver.stopping:
            raise JobFailed(
                f"server is shutting down ({self.driver.stopping}); the request was aborted", 503
            )
        why = item.abort_reason or "abort"
        raise JobFailed(
            f"the engine ended the request after {self.completion[i]} tokens, before it "
            f"finished ({why})",
            500,
        )

    async def _next(self) -> tuple[int, Any]:
        if self.deadline is None:
            return await self.queue.get()
        try:
            async with asyncio.timeout_at(self.deadline):
                return await self.queue.get()
        except TimeoutError:
            self.close(DEADLINE)
            raise JobFailed(
                f"the request did not finish within the server's deadline of "
                f"{self.deadline_s:g} s (--request-timeout); it was aborted",
                504,
            ) from None

    def close(self, reason: str = CLIENT_DISCONNECT) -> None:
        """Abort every choice that has not ended, once, saying why. Their endings still arrive
        (the abort's own output) and are counted then."""
        for rid in self.open - self.asked:
            self.driver.abort(rid, reason)
        self.asked |= self.open

    def end_span(self, status: int, error: str | None = None) -> None:
        """End the server span (once) with what the response reports. Never raises."""
        span, self.span = self.span, None
        if span is None:
            return
        try:
            u = self.usage()
            first = min((t.first_ns for t in self.timers if t.first_ns), default=None)
            ttft = None if first is None else (first - self.started_ns) / 1e9
            span.set_attributes(
                tr.clean(
                    {
                        "http.response.status_code": status,
                        "gen_ai.usage.input_tokens": u["prompt_tokens"],
                        "gen_ai.usage.output_tokens": u["completion_tokens"],
                        "gen_ai.usage.cache_read.input_tokens": self.cached,
                        "gen_ai.response.finish_reasons": [r or "" for r in self.reasons],
                        "attest.cached_tokens": self.cached,
                        "attest.parks": self.parks,
                        "attest.retractions": self.retractions,
                        "attest.ttft_s": None if ttft is None else round(ttft, 6),
                    }
                )
            )
            if error is not None:
                tr.set_error(span, error)
            span.end()
        except Exception:
            pass  # tracing never fails a request

    def metrics(self) -> dict[str, float | None] | None:
        """The request's timings as vLLM's per-request ``metrics`` object has them, in
        milliseconds, from the numbers its ``request.finish`` receipt has (``queue_s``, ``ttft_s``
        and ``e2e_s``, each from its arrival): the queue, the first token from its admission,
        the decode from its first token to its last, the mean gap between tokens and the
        tokens per second from its admission. None for several choices (no one request's
        timings are the request's) or a choice that never ended in the scheduler."""
        if len(self.timings) != 1 or (t := self.timings[0]) is None:
            return None
        tokens, queue, ttft, e2e = self.completion[0], t["queue_s"], t["ttft_s"], t["e2e_s"]
        decode = None if ttft is None or e2e is None else e2e - ttft
        ran = None if queue is None or e2e is None else e2e - queue

        def ms(s: float | None) -> float | None:
            return None if s is None else round(s * 1e3, 3)

        return {
            "time_to_first_token_ms": ms(None if ttft is None or queue is None else ttft - queue),
            "generation_time_ms": ms(decode),
            "queue_time_ms": ms(queue),
            "mean_itl_ms": ms(decode / (tokens - 1)) if decode is not None and tokens > 1 else None,
            "tokens_per_second": round(tokens / ran, 3) if ran else None,
        }

    def usage(self) -> dict[str, Any]:
        done = sum(self.completion)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }


def choice_params(params: SamplingParams, i: int) -> SamplingParams:
    """Choice ``i``'s params: seed + i, wrapped into the signed 64-bit range (the generator
    takes a seed modulo 2**64, so a wrapped seed draws what seed + i would)."""
    if i == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + i - SEED_MIN) % 2**64 + SEED_MIN)
