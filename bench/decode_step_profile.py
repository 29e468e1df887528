"""Where one decode step's time goes at batch B: the whole forward, the attention backend's share,
and the top operators by self CPU time (torch.profiler), for one attention backend.

B requests with unseen random prompts are prefilled, then every decode forward of exactly B
requests is timed; after a few warm steps one is profiled. The figures are medians over the
timed steps.

    .venv/bin/python bench/decode_step_profile.py [--backend torch] [--batch 32] [--steps 12]
        [--quant int8|int4]
    .venv/bin/python bench/decode_step_profile.py --prefill 512 [--quant ...]   # one prompt's
        prefill instead: unseen prompts, the prefix cache emptied, median of --steps runs
    .venv/bin/python bench/decode_step_profile.py --prefill 128 --prompts 64   # 64 prompts'
        prefill together, to their first tokens
    --dtype bfloat16: exact mode's bfloat16 arm (float32 by default)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's engine, not another's


def profile_step(llm, batch: int, prompt_len: int, steps: int, top: int, seed: int = 0) -> dict:
    """Time the decode forwards of ``batch`` requests; profile one. Returns medians in ms and
    the profiler's table."""
    from engine import SamplingParams

    runner = llm.core.scheduler.runner
    backend = runner.model.backend
    forward, attend = runner.forward, backend.forward
    step_ms, attn_ms, table, acc = [], [], [""], [0.0]

    def timed_attend(*a, **k):
        t = time.perf_counter()
        out = attend(*a, **k)
        acc[0] += time.perf_counter() - t
        return out

    def timed_forward(b, *a, **k):
        if len(b) != batch or any(len(e.token_ids) != 1 for e in b):
            return forward(b, *a, **k)
        acc[0] = 0.0
        if len(step_ms) == 3:  # warm by now: profile this one, untimed
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                out = forward(b, *a, **k)
            table[0] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
            step_ms.append(float("nan"))
            attn_ms.append(float("nan"))
            return out
        t = time.perf_counter()
        out = forward(b, *a, **k)
        step_ms.append((time.perf_counter() - t) * 1e3)
        attn_ms.append(acc[0] * 1e3)
        return out

    rng = random.Random(seed)
    vocab = runner.model.cfg.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(batch)]
    runner.forward, backend.forward = timed_forward, timed_attend
    try:
        llm.generate(prompts, SamplingParams(max_tokens=steps + 5, temperature=0, ignore_eos=True))
    finally:
        runner.forward, backend.forward = forward, attend
    steps_ok = [s for s in step_ms if s == s]
    attn_ok = [a for a in attn_ms if a == a]
    return {
        "step_ms": statistics.median(steps_ok),
        "attention_ms": statistics.median(attn_ok),
        "steps": len(steps_ok),
        "table": table[0],
    }


def profile_prefill(llm, length: int, runs: int, top: int, n: int = 1, seed: int = 0) -> dict:
    """The prefill of ``n`` unseen ``length``-token prompts to their first tokens, measured as
    ``engine bench --table`` measures it (``measure.method``: cache emptied, every run
    asserted uncached); one more run is profiled."""
    from measure.method import Prompts, attest_generate

    go, prompts = attest_generate(llm), Prompts(llm.core.model_config.vocab_size, seed)
    go(prompts.take(n, length), 1)  # warm-up
    took = [go(prompts.take(n, length), 1) for _ in range(runs)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        go(prompts.take(n, length), 1)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    return {"ms": statistics.median(took) * 1e3, "runs": runs, "table": table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--quant", choices=("int8", "int4"), default=None, help="fast mode")
    ap.add_argument("--prefill", type=int, default=0, help="profile a prefill instead")
    ap.add_argument("--prompts", type=int, default=1, help="--prefill: prompts prefilled at once")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = ap.parse_args()

    from engine import LLM

    if args.prefill:
        llm = LLM(
            attention_backend=args.backend,
            kv_tokens=args.prompts * (args.prefill + 64),
            max_running=max(args.prompts, 1),
            quant=args.quant,
            dtype=args.dtype,
            speculative="off",
        )
        r = profile_prefill(llm, args.prefill, args.steps, args.top, args.prompts)
        tokens = args.prompts * args.prefill
        print(f"cpu: {describe()}; threads: {torch.get_num_threads()}")
        print(
            f"weights {args.quant or 'exact'} {args.dtype}, backend {args.backend}: prefill of "
            f"{args.prompts} x {args.prefill} tokens {r['ms']:.1f} ms = "
            f"{tokens / r['ms'] * 1e3:.1f} tok/s (median of {r['runs']})"
        )
        print(r["table"])
        return

    llm = LLM(
        attention_backend=args.backend,
        kv_tokens=args.batch * (args.prompt_len + args.steps + 16),
        max_running=args.batch,
        receipts=False,
        quant=args.quant,
        dtype=args.dtype,
        speculative="off",
    )
    r = profile_step(llm, args.batch, args.prompt_len, args.steps, args.top)
    print(f"cpu: {describe()}; threads: {torch.get_num_threads()}")
    # the one native call (engine/model/native_step.py) attends inside it, unseen by the backend
    one_call = llm.core.model.native_step is not None and r["attention_ms"] == 0
    attention = "in the one native call" if one_call else f"{r['attention_ms']:.1f} ms"
    print(
        f"weights {args.quant or 'exact'} {args.dtype}, backend {args.backend}, batch {args.batch}, prompt {args.prompt_len}: decode step "
        f"{r['step_ms']:.1f} ms, attention {attention} "
        f"(median of {r['steps']} steps)"
    )
    print(r["table"])


if __name__ == "__main__":
    main()
