"""Job: one HTTP request's choices in the scheduler, from submission to the last output.

A request for ``n`` choices is ``n`` scheduler requests sharing one queue. The job yields each
output with its choice index, times it for /metrics, counts usage, ends the request's server span
and aborts whatever has not finished when it is closed (a client that went away).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from engine.messages import StepOutput
from engine.obs import tracing as tr
from engine.obs.metrics import ServerMetrics
from engine.sampling_params import SamplingParams
from engine.server.driver import EngineDriver, Submission


class JobFailed(Exception):
    """A request that cannot complete: the scheduler refused it, died, or is stopping."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Job:
    """One HTTP request in the scheduler; ``t0_ns`` is its arrival (wall clock)."""

    def __init__(
        self,
        driver: EngineDriver,
        metrics: ServerMetrics,
        rid: str,
        ids: list[int],
        params: SamplingParams,
        n: int,
        t0_ns: int,
    ) -> None:
        self.driver = driver
        self.rid = rid
        self.queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        rids = [rid] if n == 1 else [f"{rid}-{i}" for i in range(n)]
        self.subs = [
            # several seeded choices must still differ: each draws from its own seed
            Submission(r, ids, choice_params(params, i), loop, self.queue)
            for i, r in enumerate(rids)
        ]
        self.index = {r: i for i, r in enumerate(rids)}
        self.open = set(rids)
        # time to first token counts from the request's arrival (t0_ns), for /metrics and spans
        self.started_ns = t0_ns
        self.timers = [metrics.timer(len(ids) if i == 0 else 0, t0_ns) for i in range(n)]
        self.completion = [0] * n
        self.cached = 0
        self.prompt_tokens = len(ids)
        self.reasons: list[str | None] = [None] * n
        self.parks = self.retractions = 0
        self.trace: str | None = None  # the traceparent the scheduler's spans go under
        self.span: Any = None  # the HTTP server span (tracing on)

    def submit(self) -> None:
        try:
            for sub in self.subs:
                self.driver.submit(sub, self.trace)
        except RuntimeError as e:
            self.close()
            raise JobFailed(str(e), 503) from e

    async def events(self) -> AsyncIterator[tuple[int, StepOutput]]:
        while self.open:
            item = await self.queue.get()
            if isinstance(item, Exception):
                raise JobFailed(str(item), 400 if isinstance(item, ValueError) else 503)
            i = self.index[item.rid]
            n_new = len(item.new_token_ids)
            self.timers[i].tokens(n_new, item.cached_tokens)
            self.completion[i] += n_new
            self.cached = max(self.cached, item.cached_tokens)
            if item.finished:
                self._finish(i, item)
            yield i, item

    def _finish(self, i: int, item: StepOutput) -> None:
        self.open.discard(item.rid)
        self.reasons[i] = item.finish_reason
        self.parks += item.parks
        self.retractions += item.retractions
        self.timers[i].end(item.finish_reason)
        if item.finish_reason == "abort" and self.driver.stopping:
            raise JobFailed(
                f"server is shutting down ({self.driver.stopping}); the request was aborted", 503
            )

    def close(self) -> None:
        for rid in self.open:
            self.driver.abort(rid)
            self.timers[self.index[rid]].end("abort")
        self.open = set()

    def end_span(self, status: int, error: str | None = None) -> None:
        """End the server span (once) with what the response reports. Never raises."""
        span, self.span = self.span, None
        if span is None:
            return
        try:
            u = self.usage()
            first = min((t.first_ns for t in self.timers if t.first_ns), default=None)
            ttft = None if first is None else (first - self.started_ns) / 1e9
            span.set_attributes(tr.clean({
                "http.response.status_code": status,
                "gen_ai.usage.input_tokens": u["prompt_tokens"],
                "gen_ai.usage.output_tokens": u["completion_tokens"],
                "gen_ai.usage.cache_read.input_tokens": self.cached,
                "gen_ai.response.finish_reasons": [r or "" for r in self.reasons],
                "attest.cached_tokens": self.cached, "attest.parks": self.parks,
                "attest.retractions": self.retractions,
                "attest.ttft_s": None if ttft is None else round(ttft, 6),
            }))  # fmt: skip
            if error is not None:
                tr.set_error(span, error)
            span.end()
        except Exception:
            pass  # tracing never fails a request

    def usage(self) -> dict[str, Any]:
        done = sum(self.completion)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }


def choice_params(params: SamplingParams, i: int) -> SamplingParams:
    if i == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + i)
