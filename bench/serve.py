"""Online serving benchmark: TTFT, inter-token latency, end-to-end latency and throughput of
`engine serve` at several concurrency levels, streaming over real HTTP.

Boots its own server on loopback (or measures one at --url), sends prompts of exactly
--prompt-len tokens (token-id prompts, so the length is exact) asking for exactly --output-len
tokens (ignore_eos), either as fast as the concurrency allows or as a Poisson process at
--rate requests/s. The baseline is the first concurrency level of the same run: the ratio
column is each level's output throughput over it.

    .venv/bin/python bench/serve.py [--concurrency 1,8,32] [--prompt-len 128] [--output-len 64]
        [--requests N] [--rate R] [--kv-tokens 16384] [--url http://127.0.0.1:PORT]

--mixed measures what a long prompt does to everyone else's next token: --streams short
prompts (--prompt-len) decoding --output-len tokens each, while --long-count prompts of
--long-len tokens (a range, lengths drawn from a seeded generator) arrive every --long-every
seconds from one second in. One server per --step-tokens value, each timed --runs times; the
table gives the streams' inter-token latency (ITL) percentiles and p99/p50, and the long
prompts' time to first token. The baseline is --step-tokens 0 (no step budget: a long prompt's
chunk is up to --chunk-tokens, the engine before the budget), measured in the same run.

    .venv/bin/python bench/serve.py --mixed [--step-tokens 0,32,64,128,256] [--runs 2]
        [--streams 8] [--prompt-len 32] [--output-len 256] [--long-len 1024,2048]
        [--long-count 3] [--long-every 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cpuinfo import describe  # noqa: E402  (bench/cpuinfo.py, beside this script)
from sse import chunks  # noqa: E402


@dataclass(slots=True)
class Sample:
    ttft: float
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    tokens: int = 0


async def one(client: httpx.AsyncClient, prompt: list[int], out_len: int) -> Sample:
    body = {
        "prompt": prompt,
        "max_tokens": out_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    s, last = Sample(ttft=float("nan")), None
    async for now, chunk in chunks(client, "/v1/completions", body):
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


async def mixed_load(base: str, args, streams, longs) -> tuple[list[Sample], list[Sample]]:
    """The streams from t=0; long prompt i at t = 1 + i * long_every. Returns both samples."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, timeout=900, limits=limits) as client:

        async def late(i: int, prompt: list[int]) -> Sample:
            await asyncio.sleep(1.0 + i * args.long_every)
            return await one(client, prompt, 8)

        s = [asyncio.create_task(one(client, p, args.output_len)) for p in streams]
        lg = [asyncio.create_task(late(i, p)) for i, p in enumerate(longs)]
        return list(await asyncio.gather(*s)), list(await asyncio.gather(*lg))


def mixed_run(base: str, args, streams, longs, r: int) -> dict[str, float]:
    """One timed load against the server at ``base``: its figures."""
    # fresh prompts each run (a first token no other prompt has): no prefix-cache hits
    fresh = [[30000 + r * 1000 + i, *p[1:]] for i, p in enumerate(streams + longs)]
    s, lg = asyncio.run(mixed_load(base, args, fresh[: len(streams)], fresh[len(streams) :]))
    itl = [x * 1e3 for smp in s for x in smp.itl]
    p50, p90, p99 = (pct(itl, q) for q in (50, 90, 99))
    return {
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "ratio": p99 / p50,
        "max": max(itl),
        "ttft": statistics.median(x.ttft for x in lg),
        "ttft_max": max(x.ttft for x in lg),
        "tok_s": sum(x.tokens for x in s) / max(x.e2e for x in s),
    }


def mixed(args) -> None:
    """One server per --step-tokens value, all booted first; each run times every arm once, in
    an order rotated run by run, so the machine's drift hits the arms alike."""
    from tests.e2e.server_proc import ServerProc

    steps = [int(x) for x in args.step_tokens.split(",")]
    if 0 not in steps:
        steps.insert(0, 0)  # the baseline is always in the run
    lo, hi = (int(x) for x in args.long_len.split(","))
    rng = random.Random(0)
    streams = [
        [rng.randrange(100, 29000) for _ in range(args.prompt_len)] for _ in range(args.streams)
    ]
    longs = [
        [rng.randrange(100, 29000) for _ in range(rng.randint(lo, hi))]
        for _ in range(args.long_count)
    ]
    Path("logs").mkdir(exist_ok=True)
    load_before = os.getloadavg()[0]
    servers: dict[int, ServerProc] = {}
    rows: dict[int, list[dict[str, float]]] = {step: [] for step in steps}
    try:
        for step in steps:
            servers[step] = ServerProc(
                Path("logs") / f"bench-serve-mixed-{step}.jsonl",
                "--kv-tokens",
                str(args.kv_tokens),
                "--max-running",
                str(args.max_running),
                "--chunk-tokens",
                str(args.chunk_tokens),
                "--step-tokens",
                str(step),
                "--iteration-receipt-interval",
                "0",
                "--speculative",
                "off",
            )
            asyncio.run(level(servers[step].base, 1, 1, [longs[0][:64]], 4, None))  # warm-up
        for r in range(args.runs):
            for step in steps[r % len(steps) :] + steps[: r % len(steps)]:
                rows[step].append(mixed_run(servers[step].base, args, streams, longs, r))
                print(
                    f"  run {r + 1} step_tokens {step or 'off'}: "
                    + ", ".join(f"{k} {v:.3g}" for k, v in rows[step][-1].items()),
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for srv in servers.values():
            srv.stop()
    print(describe())
    print(
        f"load average before/after: {load_before:.2f}/{os.getloadavg()[0]:.2f}; "
        f"{args.streams} streams x {args.prompt_len}-token prompts, {args.output_len} tokens "
        f"each; {args.long_count} long prompts of {[len(x) for x in longs]} tokens (8 new "
        f"tokens each), one every {args.long_every} s from 1 s; chunk_tokens "
        f"{args.chunk_tokens}; median of {args.runs} runs per arm; float32, greedy"
    )
    print(
        "| step_tokens | ITL p50 ms | p90 ms | p99 ms | p99/p50 | max ms | long TTFT s "
        "p50/max | stream tok/s | p50, p99 vs off |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    med = {
        step: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for step, runs in rows.items()
    }
    for step, m in med.items():
        name = f"off (before: chunk {args.chunk_tokens})" if step == 0 else str(step)
        print(
            f"| {name} | {m['p50']:.1f} | {m['p90']:.1f} | {m['p99']:.1f} | {m['ratio']:.2f} "
            f"| {m['max']:.0f} | {m['ttft']:.2f}/{m['ttft_max']:.2f} | {m['tok_s']:.1f} | "
            f"{m['p50'] / med[0]['p50']:.2f}x, {m['p99'] / med[0]['p99']:.2f}x |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=None, help="default 128; --mixed: 32")
    ap.add_argument("--output-len", type=int, default=None, help="default 64; --mixed: 256")
    ap.add_argument("--mixed", action="store_true", help="streams decoding, long prompts arriving")
    ap.add_argument("--step-tokens", default="0,32,64,128,256", help="--mixed: one server each")
    ap.add_argument("--chunk-tokens", type=int, default=2048)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--long-len", default="1024,2048", help="--mixed: lo,hi tokens")
    ap.add_argument("--long-count", type=int, default=3)
    ap.add_argument("--long-every", type=float, default=4.0)
    ap.add_argument("--runs", type=int, default=1, help="--mixed: timed loads per arm")
    ap.add_argument("--requests", type=int, default=0, help="per level; 0: max(8, 2 x conc)")
    ap.add_argument("--rate", type=float, default=None, help="Poisson arrivals, requests/s")
    ap.add_argument("--kv-tokens", type=int, default=16384)
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--url", default=None, help="measure a running server instead")
    args = ap.parse_args()
    args.prompt_len = args.prompt_len or (32 if args.mixed else 128)
    args.output_len = args.output_len or (256 if args.mixed else 64)
    if args.mixed:
        return mixed(args)
    levels = [int(x) for x in args.concurrency.split(",")]

    srv = None
    if args.url:
        base = args.url.rstrip("/")
    else:
        from tests.e2e.server_proc import ServerProc

        log = Path("logs") / "bench-serve.jsonl"
        log.parent.mkdir(exist_ok=True)
        srv = ServerProc(
            log,
            "--kv-tokens",
            str(args.kv_tokens),
            "--max-running",
            str(args.max_running),
            "--iteration-receipt-interval",
            "0",
            "--speculative",
            "off",
        )
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
    print(
        f"model {served['id']}; prompt {args.prompt_len} tokens, output {args.output_len} "
        f"tokens; rate {args.rate or 'unbounded'}; streaming /v1/completions"
    )
    head = (
        f"{'conc':>4} {'reqs':>4} {'out tok/s':>9} {'req/s':>6} {'ratio':>6} | "
        f"{'TTFT ms p50/p90/p99':>22} | {'ITL ms p50/p90/p99':>20} | {'E2E s p50/p90/p99':>18}"
    )
    print(head)
    base_tps = rows[0][3]
    for conc, n, _wall, tps, rps, ttft, itl, e2e in rows:

        def trio(xs, f):
            return "/".join(format(pct(xs, q), f) for q in (50, 90, 99))

        print(
            f"{conc:>4} {n:>4} {tps:>9.1f} {rps:>6.2f} {tps / base_tps:>6.2f} | "
            f"{trio(ttft, '.0f'):>22} | {trio(itl, '.1f'):>20} | {trio(e2e, '.2f'):>18}"
        )
    print(f"ratio: output throughput over concurrency {rows[0][0]}, same run")


if __name__ == "__main__":
    main()
