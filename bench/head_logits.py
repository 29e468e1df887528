"""The LM head's logits in bfloat16 exact mode, the default model: the product storing its
bfloat16 sums widened to float32 (``model.logits``, packed on AMX's tiles where the CPU has
them) against the baseline, the bfloat16 product then ``.float()`` (the way before), the two in
turn. Before each call 160 MB are streamed through the caches, as a decode step leaves them;
per row count the median and fastest of --reps calls each, milliseconds, and the ratio of the
medians. Both ways' logits are checked to be the same bits first.

    .venv/bin/python bench/head_logits.py [--rows 1,16,64] [--reps 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

from engine import LLM
from engine.model.llama import linear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    print(f"cpu: {describe()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    llm = LLM(kv_tokens=4096, receipts=False, dtype="bfloat16", speculative="off")
    model = llm.core.model
    print(f"head packed: {model.head_packed is not None}, on the tiles: {model.packed_tiles}")
    junk = torch.ones(40_000_000)
    ways = {
        "widened": lambda h: model.logits(h),
        "bf16, then .float()": lambda h: linear(
            h, model.lm_head, model.head_orient, model.head_packed
        ).float(),
    }
    print("| rows | widened, median (fastest) | bf16 then .float(), median (fastest) | ratio |")
    print("|---:|---:|---:|---:|")
    for n in (int(r) for r in args.rows.split(",")):
        h = torch.randn(n, llm.core.model_config.hidden_size).bfloat16()
        a, b = (f(h) for f in ways.values())
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
        took: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(args.reps):
            for name, way in ways.items():
                junk.add_(1.0)
                t = time.perf_counter()
                way(h)
                took[name].append(time.perf_counter() - t)
        med = {k: statistics.median(v) * 1e3 for k, v in took.items()}
        cells = " | ".join(f"{med[k]:.2f} ({min(v) * 1e3:.2f})" for k, v in took.items())
        print(f"| {n} | {cells} | {med['bf16, then .float()'] / med['widened']:.2f}x |", flush=True)
    llm.close()


if __name__ == "__main__":
    main()
