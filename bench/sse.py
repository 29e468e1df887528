"""The server's streamed answers, as the benchmarks read them: each ``data:`` chunk parsed, with
the moment it arrived."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import orjson


async def chunks(
    client: httpx.AsyncClient, path: str, body: dict
) -> AsyncIterator[tuple[float, dict]]:
    """(arrival time, chunk) for each chunk of the stream ``body`` asks ``path`` for; an error
    chunk (e.g. the request's deadline passed mid-stream) raises."""
    async with client.stream("POST", path, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream ended in an error: {chunk['error'].get('message')}")
            yield time.perf_counter(), chunk
