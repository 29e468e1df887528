"""Decode attention alone, as one decode step runs it: every layer's own paged pool, B streams
of L tokens of context, the default model's heads (9 query heads on 3 KV heads of 64), the
native kernel (``torch.ops.attest.decode_attention``, ``kernels/cpu_ops.cpp``) against the
grouped paged decode in torch (``kernels.paged_decode``, the path without the native ops), in
the same run.

Each figure is the median of --runs timings of one pass over --layers layers (each layer a pool
of its own, pages of --page-size slots laid out as the allocator lays them out), in ms; GB/s is
the K and V bytes the pass reads over its time.

    .venv/bin/python bench/decode_attention.py [--streams 16,64] [--context 160] [--layers 30]
        [--dtype bfloat16] [--threads N] [--heads 9,3,64]

``--heads H,KVH,D``: query heads, KV heads and head size (the default model's by default); the
table's last column is the native kernel's nanoseconds per (stream, layer, slot of context).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import cpu_ops  # noqa: E402
from kernels.torch_ref import TorchReferenceBackend  # noqa: E402
from tests.unit.paged_batch import make_paged_batch  # noqa: E402

HEADS = "9,3,64"  # the default model's query heads, KV heads, head size


def timed(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="16,64")
    ap.add_argument("--context", type=int, default=160, help="tokens of context per stream")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: as set)")
    ap.add_argument("--heads", default=HEADS, help="H,KVH,D: query heads, KV heads, head size")
    args = ap.parse_args()
    heads, kv_heads, head_dim = (int(v) for v in args.heads.split(","))
    if args.threads:
        torch.set_num_threads(args.threads)
    if not cpu_ops.load():
        raise SystemExit(f"the native ops are not built here: {cpu_ops.why_not()}")
    dtype = getattr(torch, args.dtype)
    paths = {"native": TorchReferenceBackend("native"), "grouped": TorchReferenceBackend("grouped")}
    print(f"cpu: {describe()}; threads: {torch.get_num_threads()}")
    print(
        f"{args.layers} layers' decode attention, {heads} heads on {kv_heads} KV heads of "
        f"{head_dim}, {args.dtype} pool and queries, pages of {args.page_size}, context "
        f"{args.context}; ms per pass (median of {args.runs})"
    )
    print("| streams | native ms | native GB/s | grouped ms | grouped / native | native ns/slot |")
    print("|---|---|---|---|---|---|")
    for n in (int(s) for s in args.streams.split(",")):
        spec = [(args.context - 1, 1)] * n  # one new token on a context of L - 1
        batches = [
            make_paged_batch(
                spec, heads, kv_heads, head_dim, dtype, page_size=args.page_size, seed=layer
            )
            for layer in range(args.layers)
        ]
        ms = {}
        for name, path in paths.items():

            def one_pass(path=path, batches=batches) -> None:
                for b in batches:
                    path.forward(b.q, b.k, b.v, b.kv, b.meta, b.scale)

            ms[name] = timed(one_pass, args.runs)
        slots = args.layers * n * args.context
        gbs = slots * kv_heads * head_dim * 2 * dtype.itemsize / ms["native"] / 1e6
        ratio = ms["grouped"] / ms["native"]
        per_slot = ms["native"] * 1e6 / slots
        print(
            f"| {n} | {ms['native']:.2f} | {gbs:.1f} | {ms['grouped']:.2f} | {ratio:.2f}x "
            f"| {per_slot:.1f} |"
        )


if __name__ == "__main__":
    main()
