"""Where a whole decode step's time goes at B streams, the scheduler's part included: each
operator's self CPU time per decode step (torch.profiler), as the difference between a
``generate`` of 1 + ``--steps`` greedy tokens per stream and one of 1 token, on unseen random
prompts with the prefix cache emptied. ``bench/decode_step_profile.py`` times the forward
alone; what a step does around it (the LM head's logits copied, sampled, the requests
advanced) shows here.

    .venv/bin/python bench/step_ops.py [--streams 64] [--steps 32] [--dtype bfloat16]
        [--quant int8|int4] [--top 12]
    PYTHONPATH=OTHER_TREE .venv/bin/python OTHER_TREE/bench/step_ops.py ...   # another tree
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's engine, not another's

PROMPT = 128  # tokens per stream's prompt


def per_op(llm, streams: int, new: int, seed: int) -> dict[str, tuple[float, int]]:
    """{operator: (self CPU microseconds, calls)} over one generate of ``new`` tokens per
    stream, from the empty prefix cache."""
    from engine import SamplingParams

    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 40000) for _ in range(PROMPT)] for _ in range(streams)]
    llm.core.scheduler.cache.reset_to_empty()
    params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        outs = llm.generate(prompts, params)
    assert all(len(o.token_ids) == new for o in outs)
    return {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--quant", choices=("int8", "int4"), default=None, help="fast mode")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()

    from engine import LLM

    n = args.streams
    llm = LLM(
        kv_tokens=n * (PROMPT + args.steps + 16),
        max_running=n,
        receipts=False,
        quant=args.quant,
        dtype=args.dtype,
        speculative="off",
    )
    per_op(llm, n, 4, seed=1)  # warm: every shape once
    one, full = per_op(llm, n, 1, seed=2), per_op(llm, n, 1 + args.steps, seed=3)
    rows = []
    for key, (us, calls) in full.items():
        us0, calls0 = one.get(key, (0.0, 0))
        rows.append(((us - us0) / args.steps / 1e3, (calls - calls0) / args.steps, key))
    rows.sort(reverse=True)
    print(f"cpu: {describe()}; threads: {torch.get_num_threads()}")
    print(
        f"{args.quant or args.dtype}, {n} streams: {sum(r[0] for r in rows):.2f} ms of self CPU "
        f"per decode step ({args.steps} steps of {n} tokens)"
    )
    for ms, calls, key in rows[: args.top]:
        print(f"  {ms:8.3f} ms  {calls:6.1f} calls  {key}")


if __name__ == "__main__":
    main()
