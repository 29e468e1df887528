"""Agent lanes as a window's load (``[regime.load] lanes = N``): N conversations with a shared
system prompt, driven across the boots of one durable KV store. Boot 1 runs each lane's first
turn, checkpoints the conversation (``POST /v1/checkpoints``, id ``lane-I``) and lane 0's
branch (``lane-0-branch``: the same history and another question); every later boot continues
every conversation one turn from its checkpoint, so its prompt begins with what the store
holds. Token ids are random, as the plain load's are; the lanes' text is the same on every run
with the same seed."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import httpx

from measure.loadgen import TOKEN_IDS, LoadResult, LoadShape


def conversations(shape: LoadShape) -> list[list[int]]:
    """Each lane's first prompt: the shared system prompt, then the lane's own question."""
    rng = random.Random(shape.seed)
    lo, hi = shape.prompt_tokens
    system = [rng.randrange(*TOKEN_IDS) for _ in range(hi)]
    return [
        system + [rng.randrange(*TOKEN_IDS) for _ in range(rng.randint(1, max(1, lo)))]
        for _ in range(shape.lanes)
    ]


async def _complete(client: httpx.AsyncClient, ids: list[int], n: int, res: LoadResult) -> None:
    body = {"prompt": ids, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    r = await client.post("/v1/completions", json=body)
    res.sent += 1
    res.status[r.status_code] += 1
    if r.status_code == 200:
        res.tokens += r.json()["usage"]["completion_tokens"]
    else:
        res.fail(f"{r.status_code} {r.text}")


async def _checkpoint(client: httpx.AsyncClient, ids: list[int], cid: str, res: LoadResult) -> None:
    r = await client.post("/v1/checkpoints", json={"prompt": ids, "id": cid})
    res.sent += 1
    res.status[r.status_code] += 1
    if r.status_code != 200:
        res.fail(f"checkpoint {cid}: {r.status_code} {r.text}")


async def drive_lanes(
    base: str, shape: LoadShape, boot: int, on_done: Callable[[], None] = lambda: None
) -> LoadResult:
    """Boot ``boot`` (0: the first) of the lanes' sequence."""
    res, rng = LoadResult(), random.Random(shape.seed + 1)
    lanes = conversations(shape)
    asks = [[rng.randrange(*TOKEN_IDS) for _ in range(8)] for _ in range(len(lanes) + 1)]
    out = shape.output_tokens[0] or 1
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:

        async def lane(i: int, ids: list[int]) -> None:
            if boot == 0:
                await _complete(client, ids, out, res)
                await _checkpoint(client, ids, f"lane-{i}", res)
                if i == 0:
                    await _checkpoint(client, ids + asks[-1], "lane-0-branch", res)
            else:
                await _complete(client, ids + asks[i], out, res)
            on_done()

        await asyncio.gather(*(lane(i, ids) for i, ids in enumerate(lanes)))
    res.seconds = time.monotonic() - t0
    return res
