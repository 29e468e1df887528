"""One linear layer's product at several row counts: exact mode's float32 against fast mode's
candidates (dense bfloat16, the packed int8 and int4 kernels, and where the CPU has AVX-512 VNNI
the integer products of ``engine.model.int_vnni``: columns int8v and int4v, their ratios to
torch's kernels last), on this CPU. Fast mode's kernel
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

from engine.model.int_vnni import int_vnni_native
from engine.model.llama import linear
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
    ints = int_vnni_native(cpu_flags())
    q8v = QuantWeight(w, "int8", torch.bfloat16, 1 << 20, int_vnni=ints)
    q4v = QuantWeight(w, "int4", torch.bfloat16, 1 << 20, int_vnni=ints)
    assert q8.mode == "int8" and q4.mode == "int4"
    for plain, ours in ((q8, q8v), (q4, q4v)):  # which kernel each column runs
        assert plain.packed_form()[0].dim() == 2 and ours.packed_form()[0].dim() == (
            4 if ints else 2
        )
    print(f"cpu: {describe()}; threads: {torch.get_num_threads()}")
    print(
        f"one {args.out_features}x{args.in_features} product, us per call (median of {args.runs})"
    )
    v = "" if ints else " (no VNNI here: int8v is int8, int4v int4)"
    print(
        f"{'rows':>5} {'fp32':>8} {'bf16':>8} {'int8':>8} {'int4':>8} {'int8v':>8} {'int4v':>8}"
        f"   best / fp32   int8 / int8v, int4 / int4v{v}"
    )
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, args.in_features)
        xb = x.bfloat16()
        calls = {
            "fp32": partial(linear, x, w),
            "bf16": partial(linear, xb, dense16),
            "int8": partial(q8.packed_matmul, xb),
            "int4": partial(q4.packed_matmul, xb),
            "int8v": partial(q8v.packed_matmul, xb),
            "int4v": partial(q4v.packed_matmul, xb),
        }
        r = {name: per_call_us(fn, args.iters, args.runs) for name, fn in calls.items()}
        best = min(("bf16", "int8", "int4", "int8v", "int4v"), key=r.get)
        cols = " ".join(f"{r[k]:>8.1f}" for k in ("fp32", "bf16", "int8", "int4", "int8v", "int4v"))
        print(
            f"{rows:>5} {cols}   {best} {r['fp32'] / r[best]:.2f}x   "
            f"{r['int8'] / r['int8v']:.2f}x, {r['int4'] / r['int4v']:.2f}x"
        )


if __name__ == "__main__":
    main()
