"""Tensor parallelism on this machine: output tokens/s at tp=1 (the baseline, same run) and at
each --tp, and what the group's own collectives cost per iteration (measured on rank 0: the
published floor's all-reduce, the digest all-gather), in exact mode (float32), greedy.

Each arm generates --streams fresh prompts of --prompt-len tokens, --new-tokens each (EOS
ignored), timed whole (prefill included), median of --runs. The prefix cache is off (a group
cannot empty one rank's cache alone) and every request's `request.finish` is asserted to show
cached == 0. On a machine with fewer cores than ranks x threads the ranks share cores: the
point of tp here is correctness; its speed is a GPU's business.

    .venv/bin/python bench/tp_group.py [--model PATH] [--tp 3] [--streams 16] [--runs 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from cpuinfo import describe  # bench/cpuinfo.py, beside this script


class Timed:
    """Wraps one method of rank 0's group view and adds up the time spent in it."""

    def __init__(self, obj: Any, name: str) -> None:
        self.calls, self.seconds = 0, 0.0
        inner = getattr(obj, name)

        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1

        setattr(obj, name, timed)

    def us(self) -> float:
        return 1e6 * self.seconds / max(1, self.calls)


def arm(model: str | None, tp: int, args: argparse.Namespace, rng: random.Random) -> dict:
    from engine import LLM, SamplingParams

    kv = args.streams * (args.prompt_len + args.new_tokens) + 64
    llm = LLM(model, tp=tp, kv_tokens=kv, prefix_cache=False, group_check_interval=args.check)
    vocab = llm.core.model_config.vocab_size
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)

    def fresh(n: int) -> list[list[int]]:
        return [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(n)]

    llm.generate(fresh(2), SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    group = llm.core.scheduler.group
    floor, digest = Timed(group, "publish"), Timed(group, "agree")
    seconds = []
    for _ in range(args.runs):
        t = time.perf_counter()
        outs = llm.generate(fresh(args.streams), params)
        seconds.append(time.perf_counter() - t)
        assert all(len(o.token_ids) == args.new_tokens for o in outs)
        fins = llm.core.receipts.of("request.finish")[-args.streams :]
        assert all(f["cached"] == 0 for f in fins), "a prefix-cache hit"
    llm.close()
    med = statistics.median(seconds)
    return {
        "tp": tp,
        "s": med,
        "tok_s": args.streams * args.new_tokens / med,
        "floor_us": floor.us(),
        "digest_us": digest.us(),
        "iters": floor.calls,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file or HF folder (default model)")
    ap.add_argument("--tp", type=int, default=3)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--check", type=int, default=1, help="digest check every N iterations")
    args = ap.parse_args()
    print(describe())
    rows = [arm(args.model, tp, args, random.Random(tp)) for tp in (1, args.tp)]
    print(
        f"{args.streams} streams x {args.prompt_len} prompt tokens, {args.new_tokens} new, "
        f"float32, median of {args.runs}, digest check every {args.check}"
    )
    print(
        f"{'tp':>3} {'median s':>9} {'out tok/s':>10} {'floor us/iter':>14} {'digest us/iter':>15}"
    )
    for r in rows:
        print(
            f"{r['tp']:>3} {r['s']:>9.2f} {r['tok_s']:>10.1f} {r['floor_us']:>14.0f} "
            f"{r['digest_us']:>15.0f}"
        )
    print(f"tp {args.tp} / tp 1 throughput: {rows[1]['tok_s'] / rows[0]['tok_s']:.2f}x")


if __name__ == "__main__":
    main()
