"""Online serving benchmark: TTFT, inter-token latency, end-to-end latency and throughput of
`engine serve` at several concurrency levels, streaming over real HTTP.

Boots its own server on loopback (or measures one at --url), sends prompts of exactly
--prompt-len tokens (token-id prompts, so the length is exact) asking for exactly --output-len
tokens (ignore_eos), either as fast as the concurrency allows or as a Poisson process at
--rate requests/s. The baseline is the first concurrency level of the same run: the ratio
column is each level's output throughput over it.

    .venv/bin/python bench/serve.py [--concurrency 1,8,32] [--prompt-len 128] [--output-len 64]
        [--requests N] [--rate R] [--kv-tokens 16384] [--url http://127.0.0.1:PORT]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclass(slots=True)
class Sample:
    ttft: float
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    tokens: int = 0


async def one(client: httpx.AsyncClient, prompt: list[int], out_len: int) -> Sample:
    body = {"prompt": prompt, "max_tokens": out_len, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    s, last = Sample(ttft=float("nan")), None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            now = time.perf_counter()
            if chunk.get("usage"):
                s.tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                if last is None:
                    s.ttft = now - t0
                else:
                    s.itl.append(now - last)
                last = now
    s.e2e = time.perf_counter() - t0
    return s


async def level(base: str, conc: int, n: int, prompts, out_len: int, rate: float | None):
    sem = asyncio.Semaphore(conc)
    limits = httpx.Limits(max_connections=conc + 4, max_keepalive_connections=conc + 4)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        rng = random.Random(1)

        async def run(i: int) -> Sample:
            async with sem:
                return await one(client, prompts[i % len(prompts)], out_len)

        t0 = time.perf_counter()
        tasks = []
        for i in range(n):
            tasks.append(asyncio.create_task(run(i)))
            if rate:
                await asyncio.sleep(rng.expovariate(rate))
        samples = await asyncio.gather(*tasks)
        return samples, time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--requests", type=int, default=0, help="per level; 0: max(8, 2 x conc)")
    ap.add_argument("--rate", type=float, default=None, help="Poisson arrivals, requests/s")
    ap.add_argument("--kv-tokens", type=int, default=16384)
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--url", default=None, help="measure a running server instead")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]

    srv = None
    if args.url:
        base = args.url.rstrip("/")
    else:
        from tests.e2e.server_proc import ServerProc

        log = Path("logs") / "bench-serve.jsonl"
        log.parent.mkdir(exist_ok=True)
        srv = ServerProc(log, "--kv-tokens", str(args.kv_tokens),
                         "--max-running", str(args.max_running), "--iteration-receipt-interval", "0")  # fmt: skip
        base = srv.base
    try:
        served = httpx.get(base + "/v1/models").json()["data"][0]
        rng = random.Random(0)
        # distinct prompts: no prefix-cache hits flatter the numbers
        prompts = [[rng.randrange(100, 40000) for _ in range(args.prompt_len)] for _ in range(256)]
        asyncio.run(level(base, 1, 1, prompts[-1:], 4, None))  # warm-up
        rows = []
        for conc in levels:
            n = args.requests or max(8, 2 * conc)
            samples, wall = asyncio.run(level(base, conc, n, prompts, args.output_len, args.rate))
            toks = sum(s.tokens for s in samples)
            ttft = [s.ttft * 1e3 for s in samples]
            itl = [x * 1e3 for s in samples for x in s.itl]
            e2e = [s.e2e for s in samples]
            rows.append((conc, n, wall, toks / wall, n / wall, ttft, itl, e2e))
    finally:
        if srv is not None:
            srv.stop()
    print(f"model {served['id']}; prompt {args.prompt_len} tokens, output {args.output_len} "
          f"tokens; rate {args.rate or 'unbounded'}; streaming /v1/completions")  # fmt: skip
    head = (f"{'conc':>4} {'reqs':>4} {'out tok/s':>9} {'req/s':>6} {'ratio':>6} | "
            f"{'TTFT ms p50/p90/p99':>22} | {'ITL ms p50/p90/p99':>20} | {'E2E s p50/p90/p99':>18}")  # fmt: skip
    print(head)
    base_tps = rows[0][3]
    for conc, n, _wall, tps, rps, ttft, itl, e2e in rows:

        def trio(xs, f):
            return "/".join(format(pct(xs, q), f) for q in (50, 90, 99))

        print(f"{conc:>4} {n:>4} {tps:>9.1f} {rps:>6.2f} {tps / base_tps:>6.2f} | "
              f"{trio(ttft, '.0f'):>22} | {trio(itl, '.1f'):>20} | {trio(e2e, '.2f'):>18}")  # fmt: skip
    print(f"ratio: output throughput over concurrency {rows[0][0]}, same run")


if __name__ == "__main__":
    main()
