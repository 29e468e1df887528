"""Exact mode with and without oneDNN's packed weights (``engine.model.orient``), one model in one
process, the two arms alternated within each run, in the other order on every second run, so
a busy machine's drift hits them alike.

The engine boots once in --dtype. Arm "packed" is the orientation the boot measured (the packed
way among the three); arm "two ways" is the same model's products measured again over
``F.linear`` and ``(W @ x.T).T`` only (what the engine chose before the packed way), swapped in
for its runs. Decode and prefill rates are measure/method.py's (also ``engine bench --table``'s):
fresh prompts, the prefix cache emptied, every request asserted uncached; a prefill is --prompts
prompts of --prompt-len tokens to their first tokens. Figures are medians of --runs.

    .venv/bin/python bench/prepacked.py [--dtype bfloat16] [--streams 1,16,64] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

from engine.model.native_step import MATRICES
from engine.model.orient import HEAD_ROWS, measure
from measure.method import Prompts, attest_generate, decode_rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--streams", default="1,16,64")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=64, help="prompts prefilled together")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from engine import LLM

    streams = [int(s) for s in args.streams.split(",")]
    most = max(*streams, args.prompts)
    llm = LLM(
        kv_tokens=most * (args.prompt_len + args.new_tokens + 16),
        max_running=most,
        dtype=args.dtype,
        speculative="off",
    )
    model = llm.core.model
    packed = (model.orient, model.head_orient)
    layer0 = [model.layers[0][k] for k in MATRICES]
    two_ways = (measure(layer0)[0], measure([model.lm_head], HEAD_ROWS)[0])
    arms = {"packed": packed, "two ways": two_ways}
    go, prompts = attest_generate(llm), Prompts(model.cfg.vocab_size)
    print(f"cpu: {describe()}; threads: {torch.get_num_threads()}; {args.dtype}")
    for name, (lay, head) in arms.items():
        print(
            f"{name}: mm at {lay.fields()} / {head.fields()}, packed at "
            f"{lay.packed_fields()} / {head.packed_fields()} (layers / head)"
        )
    got: dict[str, dict[str, list[float]]] = {a: {} for a in arms}
    for run in range(args.runs):
        order = list(arms.items())  # the first arm of a run goes first on even runs only
        for name, (lay, head) in order if run % 2 == 0 else order[::-1]:
            model.orient, model.head_orient = lay, head
            for n in streams:
                rate = decode_rate(go, prompts, n, args.prompt_len, args.new_tokens)[0]
                got[name].setdefault(f"decode {n}", []).append(rate)
            t = time.perf_counter()
            go(prompts.take(args.prompts, args.prompt_len), 1)
            got[name].setdefault(f"prefill {args.prompts}x{args.prompt_len} s", []).append(
                time.perf_counter() - t
            )
    model.orient, model.head_orient = packed
    cols = list(got["packed"])
    print("| arm | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, figs in got.items():
        print(f"| {name} | " + " | ".join(f"{statistics.median(figs[c]):.2f}" for c in cols) + " |")
    llm.close()


if __name__ == "__main__":
    main()
