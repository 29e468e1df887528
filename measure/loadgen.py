"""A load shape driven into a running server over loopback: what `engine window` sends.

Prompts are token ids, so their lengths are exact (the regime of a window is stated in tokens),
and every request asks for exactly its output length (``ignore_eos``). A shared prefix is one
token sequence that every prompt starts with. Streams are read to the end; an answer that is not
a 200 or an error event in a stream is counted by status and kept (a few) as text.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson

from engine.observability.clip import clip_words

TOKEN_IDS = (10, 250)  # ids every vocabulary in use here has (the tiny test model's has 320)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadShape:
    """The fields of a window's ``[regime.load]`` (audit.recipe.LOAD_DEFAULTS)."""

    requests: int = 32
    prompt_tokens: tuple[int, int] = (4, 120)
    output_tokens: tuple[int, int] = (8, 60)
    shared_prefix: float = 0.0
    repeat: int = 0
    concurrency: int = 32
    duration_s: float = 0.0
    passes: int = 1  # waves: each pass sent whole and answered before the next
    stream: bool = True
    seed: int = 0
    lanes: int = 0  # > 0: agent lanes across the boots of one store (measure/lanes.py)


@dataclass(slots=True)
class LoadResult:
    sent: int = 0
    status: Counter = field(default_factory=Counter)  # HTTP status (or "error event") -> count
    tokens: int = 0  # completion tokens the server reported
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)  # the first few non-200 answers

    def fail(self, text: str) -> None:
        if len(self.failures) < 5:
            self.failures.append(clip_words(text, 300))


def prompts(shape: LoadShape) -> list[tuple[list[int], int]]:
    """One pass of (prompt ids, max tokens), the same for every run with this shape and seed."""
    rng = random.Random(shape.seed)
    lo, hi = shape.prompt_tokens
    shared = [rng.randrange(*TOKEN_IDS) for _ in range(round(shape.shared_prefix * hi))]
    out = []
    for _ in range(shape.requests):
        n = rng.randint(lo, hi)
        head = shared[: min(len(shared), n - 1)] if n > 1 else []
        own = max(1, n - len(head))
        if shape.repeat:  # text to copy: one random run, repeated to the length
            run = [rng.randrange(*TOKEN_IDS) for _ in range(min(shape.repeat, own))]
            ids = head + (run * (own // len(run) + 1))[:own]
        else:
            ids = head + [rng.randrange(*TOKEN_IDS) for _ in range(own)]
        out.append((ids, rng.randint(*shape.output_tokens)))
    return out


async def _one(
    client: httpx.AsyncClient, ids: list[int], max_tokens: int, stream: bool, res: LoadResult
) -> None:
    body = {
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    if not stream:
        r = await client.post("/v1/completions", json=body)
        res.status[r.status_code] += 1
        if r.status_code == 200:
            res.tokens += r.json()["usage"]["completion_tokens"]
        else:
            res.fail(f"{r.status_code} {r.text}")
        return
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            res.status[r.status_code] += 1
            res.fail(f"{r.status_code} {(await r.aread()).decode(errors='replace')}")
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                res.status["error event"] += 1
                res.fail(line)
                return
            if chunk.get("usage"):
                res.tokens += chunk["usage"]["completion_tokens"]
        res.status[200] += 1


async def drive(
    base: str,
    shape: LoadShape,
    on_done: Callable[[], None] = lambda: None,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """Send the shape's requests to the server at ``base`` (``concurrency`` at once), ``passes``
    times, a pass answered whole before the next starts (a wave: its prompts arrive together,
    then their decodes run out); with ``duration_s``, pass after pass until it is over too. Wait
    for every answer."""
    res, work = LoadResult(), prompts(shape)
    sem = asyncio.Semaphore(shape.concurrency)
    limits = httpx.Limits(max_connections=shape.concurrency + 4)
    t0 = time.monotonic()
    async with httpx.AsyncClient(
        base_url=base, timeout=600, limits=limits, headers=headers
    ) as client:

        async def run(ids: list[int], max_tokens: int) -> None:
            async with sem:
                try:
                    await _one(client, ids, max_tokens, shape.stream, res)
                except httpx.HTTPError as e:
                    res.status[type(e).__name__] += 1
                    res.fail(f"{type(e).__name__}: {e}")
                on_done()

        for done in itertools.count(1):
            tasks = []
            for ids, max_tokens in work:  # one pass; the semaphore keeps `concurrency` in flight
                res.sent += 1
                tasks.append(asyncio.create_task(run(ids, max_tokens)))
            await asyncio.gather(*tasks)
            if done >= shape.passes and time.monotonic() - t0 >= shape.duration_s:
                break
    res.seconds = time.monotonic() - t0
    return res
