"""Where a whole decode step's time goes at B streams, the scheduler's part included: each
operator's self CPU time per decode step (torch.profiler), over the scheduler steps of a greedy
``generate`` in which every request decodes (no prefill chunk in them), on unseen random prompts
with the prefix cache emptied. ``bench/decode_step_profile.py`` times the forward alone; what a
step does around it (the LM head's logits copied, sampled, the requests advanced) shows here.

    .venv/bin/python bench/step_ops.py [--streams 64] [--steps 32] [--dtype bfloat16]
        [--quant int8|int4] [--top 12]
    PYTHONPATH=OTHER_TREE .venv/bin/python OTHER_TREE/bench/step_ops.py ...   # another tree
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from pathlib import Path

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's engine, not another's

PROMPT = 128  # tokens per stream's prompt
MARK = "decode step"


def per_op(llm, streams: int, new: int, seed: int) -> tuple[int, dict[str, list[float]]]:
    """(decode steps seen, {operator: [self CPU microseconds, calls]}) over the steps of one
    generate of ``new`` tokens per stream in which every request decodes."""
    from engine import SamplingParams

    sched = llm.core.scheduler
    real, seen = sched.step, [0]

    def step():
        decoding = not sched.waiting and all(not r.prefilling for r in sched.running)
        if not decoding:
            return real()
        seen[0] += 1
        with record_function(MARK):
            return real()

    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 40000) for _ in range(PROMPT)] for _ in range(streams)]
    sched.cache.reset_to_empty()
    params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
    sched.step = step
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            outs = llm.generate(prompts, params)
    finally:
        del sched.step
    assert all(len(o.token_ids) == new for o in outs)
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        up = e.cpu_parent
        while up is not None and up.name != MARK:
            up = up.cpu_parent
        if up is not None:
            ops[e.name][0] += e.self_cpu_time_total
            ops[e.name][1] += 1
    return seen[0], ops


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
    steps, ops = per_op(llm, n, 1 + args.steps, seed=2)
    assert steps >= args.steps - 1, steps  # the last step ends the requests
    rows = sorted(((us / steps / 1e3, calls / steps, k) for k, (us, calls) in ops.items()))
    rows.reverse()
    print(f"cpu: {describe()}; threads: {torch.get_num_threads()}")
    print(
        f"{args.quant or args.dtype}, {n} streams: {sum(r[0] for r in rows):.2f} ms of self CPU "
        f"per decode step ({steps} steps of {n} tokens)"
    )
    for ms, calls, key in rows[: args.top]:
        print(f"  {ms:8.3f} ms  {calls:6.1f} calls  {key}")


if __name__ == "__main__":
    main()
