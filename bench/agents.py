"""Agent lanes over `engine serve`: N multi-turn conversations sharing a long system prompt, each
turn tool-call shaped (the assistant calls a tool, the tool answers, the user asks on), one lane
branching into two at a middle turn; with and without the durable KV store, and with a restart
of the server halfway through. A device pool smaller than the lanes' histories makes the store
matter even without the restart.

Every turn's request is a streaming chat completion of a few greedy tokens, all lanes at once;
per arm the table gives the prompt tokens the server computed (prompt less cached, from each
answer's usage), the TTFT p50 and p90 over every turn, and the wall time. The arms' answers
must be the same tokens (the script checks the text).

With ``--crash`` the restart is a crash (the scheduler process killed with SIGKILL: nothing is
flushed at a stop) and the arms compare the store's write policies: ``back`` (pages written as
they leave memory, and at a clean stop) against ``second_hit`` (also when a prefix is first
reused), beside no store.

    .venv/bin/python bench/agents.py [--lanes 5] [--turns 4] [--system 600] [--kv-tokens 2048]
        [--output 8] [--model PATH] [--crash]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cpuinfo import describe  # noqa: E402  (bench/cpuinfo.py, beside this script)
from sse import chunks  # noqa: E402

WORDS = (
    "alpha beta gamma delta file path build test deploy queue worker cache error retry "
    "config region shard index tensor kernel batch stream token prompt"
).split()


def lanes(args) -> list[dict]:
    rng = random.Random(args.seed)
    system = " ".join(rng.choice(WORDS) for _ in range(args.system))
    out = []
    for i in range(args.lanes):
        msgs = [{"role": "system", "content": f"You are agent {i}. Tools: search, run. " + system}]
        out.append({"name": f"lane{i}", "messages": msgs, "rng": random.Random(args.seed + i)})
    return out


def next_turn(lane: dict, turn: int) -> list[dict]:
    """The user's next ask, after the tool call and result of the last turn."""
    rng = lane["rng"]
    ask = " ".join(rng.choice(WORDS) for _ in range(12))
    msgs = lane["messages"]
    if turn:
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": "search", "arguments": orjson.dumps({"q": ask[:30]}).decode()},
        }
        msgs = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": f"call_{turn}",
                "content": " ".join(rng.choice(WORDS) for _ in range(40)),
            },
        ]
    return msgs + [{"role": "user", "content": f"Step {turn}: {ask}"}]


async def ask(client: httpx.AsyncClient, messages: list[dict], out: int) -> dict:
    body = {
        "messages": messages,
        "max_tokens": out,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft, text, usage = float("nan"), "", {}
    async for now, chunk in chunks(client, "/v1/chat/completions", body):
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            delta = c.get("delta", {}).get("content")
            if delta:
                if not text:
                    ttft = now - t0
                text += delta
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ttft": ttft, "text": text, "prompt": usage["prompt_tokens"], "cached": cached}


async def run_turns(base: str, ls: list[dict], turns: range, args) -> list[dict]:
    out = []
    async with httpx.AsyncClient(base_url=base, timeout=1800) as client:
        for t in turns:
            asks = []
            for lane in ls:
                lane["pending"] = next_turn(lane, t)
                asks.append(ask(client, lane["pending"], args.output))
            if t == args.turns // 2:  # lane 0 branches: a second line from the same history
                branch = ls[0]["messages"] + [{"role": "user", "content": "Another way?"}]
                asks.append(ask(client, branch, args.output))
            t0 = time.perf_counter()
            got = await asyncio.gather(*asks)
            took = time.perf_counter() - t0
            for lane, g in zip(ls, got):
                lane["messages"] = lane["pending"] + [{"role": "assistant", "content": g["text"]}]
            for g in got:
                g["turn"], g["turn_s"], g["turn_n"] = t, took, len(got)
            out += got
    return out


def serve(log: Path, args, store: str | None, write: str | None = None):
    from tests.e2e.server_proc import ServerProc

    extra = ["--kv-store-dir", store] if store else []
    extra += ["--kv-store-write", write] if store and write else []  # None: the engine's default
    model = ["--model", args.model] if args.model else []
    return ServerProc(
        log,
        *model,
        "--kv-tokens",
        str(args.kv_tokens),
        "--speculative",
        "off",
        "--max-model-len",
        "8192",
        *extra,
        ready_timeout=600,
    )


def arm(args, tmp: Path, name: str, store: bool, restart: bool, write: str | None = None) -> dict:
    d = str(tmp / f"store-{name}") if store else None
    ls = lanes(args)
    half = args.turns // 2 if restart else args.turns
    srv = serve(tmp / f"{name}-1.jsonl", args, d, write)
    t0 = time.perf_counter()
    got = asyncio.run(run_turns(srv.base, ls, range(0, half), args))
    wall = time.perf_counter() - t0  # the turns' time; the boots are not counted
    if restart:
        if args.crash:  # the scheduler dies first: no stop, no flush
            os.kill(srv.scheduler_pid(), signal.SIGKILL)
            srv.stop(signal.SIGKILL)
        else:
            srv.stop()
        srv = serve(tmp / f"{name}-2.jsonl", args, d, write)
        t0 = time.perf_counter()
        got += asyncio.run(run_turns(srv.base, ls, range(half, args.turns), args))
        wall += time.perf_counter() - t0
    srv.stop()
    ttfts = [g["ttft"] for g in got]
    return {
        "name": name,
        "computed": sum(g["prompt"] - g["cached"] for g in got),
        "prompt": sum(g["prompt"] for g in got),
        "p50": statistics.median(ttfts),
        "p90": statistics.quantiles(ttfts, n=10)[-1],
        "wall": wall,
        "texts": [g["text"] for g in got],
        "got": got,
        "after": [g for g in got if g["turn"] >= half] if restart else [],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=5)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system", type=int, default=600, help="words of the shared system prompt")
    ap.add_argument("--kv-tokens", type=int, default=2048)
    ap.add_argument("--output", type=int, default=8)
    ap.add_argument("--model", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--crash", action="store_true", help="the restart is a SIGKILL")
    args = ap.parse_args()
    print(describe())
    with tempfile.TemporaryDirectory(prefix="agents-") as d:
        tmp = Path(d)
        if args.crash:
            arms = [
                arm(args, tmp, "no store, crash", False, True),
                arm(args, tmp, "store back, crash", True, True, "back"),
                arm(args, tmp, "store second_hit, crash", True, True, "second_hit"),
            ]
        else:
            arms = [
                arm(args, tmp, "no store", False, False),
                arm(args, tmp, "store", True, False),
                arm(args, tmp, "no store, restart", False, True),
                arm(args, tmp, "store, restart", True, True),
            ]
    same = all(a["texts"] == arms[0]["texts"] for a in arms)
    print(
        f"{args.lanes} lanes x {args.turns} turns (+1 branch), system prompt {args.system} "
        f"words, --kv-tokens {args.kv_tokens}, {args.output} tokens a turn; answers identical "
        f"across arms: {same}"
    )
    print(
        "| arm | prompt tokens | computed | TTFT p50 s | TTFT p90 s | after the restart: TTFT p50 s, computed | wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for a in arms:
        after = "-"
        if a["after"]:
            ft = statistics.median(g["ttft"] for g in a["after"])
            after = f"{ft:.2f}, {sum(g['prompt'] - g['cached'] for g in a['after'])}"
        print(
            f"| {a['name']} | {a['prompt']} | {a['computed']} | {a['p50']:.2f} | "
            f"{a['p90']:.2f} | {after} | {a['wall']:.0f} |"
        )
    turns = range(args.turns)
    print(
        f"\nper turn: TTFT p50 s / output tok/s of the turn (its {args.output} tokens a request "
        "over the turn's wall time); the restart comes before turn "
        f"{args.turns // 2}"
    )
    print("| arm | " + " | ".join(f"turn {t}" for t in turns) + " |")
    print("|---|" + "---|" * len(turns))
    for a in arms:
        cells = []
        for t in turns:
            gs = [g for g in a["got"] if g["turn"] == t]
            rate = args.output * gs[0]["turn_n"] / gs[0]["turn_s"]
            cells.append(f"{statistics.median(g['ttft'] for g in gs):.2f} / {rate:.1f}")
        print(f"| {a['name']} | " + " | ".join(cells) + " |")
    if not same:
        sys.exit("the arms' answers differ")


if __name__ == "__main__":
    main()
