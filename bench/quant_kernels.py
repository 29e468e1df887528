"""One linear layer's product at several row counts: exact mode's float32 against fast mode's
candidates (dense bfloat16, the packed int8 and int4 kernels, and where the CPU has AVX-512 VNNI
the int4 integer products of ``engine.model.int4_vnni``: column int4v, its ratio to torch's
int4 kernel last), on this CPU. Fast mode's kernel
switch (``engine.model.quant.SMALL_ROWS``) is read off this table.

The weight is the default model's fused gate/up matrix shape (3072 x 576); each figure is the
median of --runs timings of --iters calls, microseconds per call. Baseline: float32 as exact
mode computes it (``engine.model.llama.linear``), same run.

    .venv/bin/python bench/quant_kernels.py [--rows 1,2,4,8,16,32,64] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

from engine.model.llama import linear
from engine.model.int4_vnni import int4_vnni_native
from engine.model.quant import QuantWeight
from kernels.cpu_ops import cpu_flags


def per_call_us(fn, iters: int, runs: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t) / iters * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--out-features", type=int, default=3072)
    ap.add_argument("--in-features", type=int, default=576)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    w = torch.randn(args.out_features, args.in_features)
    dense16 = w.bfloat16()
    # small_rows large enough that every row count here takes the packed kernel
    q8 = QuantWeight(w, "int8", torch.bfloat16, 1 << 20)
    q4 = QuantWeight(w, "int4", torch.bfloat16, 1 << 20)
    ints = int4_vnni_native(cpu_flags())
    q4v = QuantWeight(w, "int4", torch.bfloat16, 1 << 20, int4_vnni=ints)
    assert q8.mode == "int8" and q4.mode == "int4" and q4.packed_form()[0].dim() == 2
    assert q4v.packed_form()[0].dim() == (4 if ints else 2)  # which int4 kernel each one runs
    print(f"cpu: {describe()}; threads: {torch.get_num_threads()}")
    print(
        f"one {args.out_features}x{args.in_features} product, us per call (median of {args.runs})"
    )
    v = "int4v" if ints else "(no VNNI: int4v is int4)"
    print(f"{'rows':>5} {'fp32':>8} {'bf16':>8} {'int8':>8} {'int4':>8} {'int4v':>8}   "
          f"best / fp32   int4 / {v}")  # fmt: skip
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, args.in_features)
        xb = x.bfloat16()
        calls = {
            "fp32": partial(linear, x, w),
            "bf16": partial(linear, xb, dense16),
            "int8": partial(q8.packed_matmul, xb),
            "int4": partial(q4.packed_matmul, xb),
            "int4v": partial(q4v.packed_matmul, xb),
        }
        r = {name: per_call_us(fn, args.iters, args.runs) for name, fn in calls.items()}
        best = min(("bf16", "int8", "int4", "int4v"), key=r.get)
        print(
            f"{rows:>5} {r['fp32']:>8.1f} {r['bf16']:>8.1f} {r['int8']:>8.1f} {r['int4']:>8.1f}"
            f" {r['int4v']:>8.1f}   {best} {r['fp32'] / r[best]:.2f}x   "
            f"{r['int4'] / r['int4v']:.2f}x"
        )


if __name__ == "__main__":
    main()
