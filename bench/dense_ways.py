"""The ways one dense product ``x @ W.T`` can run on this CPU, timed per row count: ``F.linear``
(the baseline: transformers' call), ``(W @ x.T).T`` (``engine.model.orient.by_mm``: one row padded
to two) and oneDNN's pre-packed linear through torch (``mkldnn._reorder_linear_weight`` for the
row count, then ``mkldnn._linear_pointwise``), for one layer's four matrices of the default model
(QKV 960x576, O 576x576, gate-up 3072x576, down 576x1536) and its LM head (49152x576).

Each figure is the fastest of --reps calls after 3 warm ones (microseconds for the layer's four
products together, or the head's one), with each way's ratio over ``F.linear``, and whether the
packed way gives ``F.linear``'s bits. What the engine chooses at load is
``engine.model.orient.measure`` over the same three ways in exact mode (its weights packed once
by ``engine.model.orient.pack``, for 64 rows, not for each count as here) and the two first in
fast mode; the last lines time that measurement itself (what it adds to a boot) for these
shapes, and say what it chose.

    .venv/bin/python bench/dense_ways.py [--rows 1,2,8,16,64,512] [--dtype float32|bfloat16]
        [--reps 30]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

from engine.model.orient import HEAD_ROWS, ROWS, by_mm, measure, pack
from kernels.timing import fastest

LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
HEAD = [(49152, 576)]


def micros(fn, reps: int) -> float:
    """The fastest of ``reps`` calls after 3 warm ones, in microseconds."""
    return fastest(fn, reps, warm=3) * 1e6


def packed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,8,16,64,512")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    print(
        f"cpu: {describe()}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.dtype}; fastest of {args.reps} calls, microseconds"
    )
    print(
        "| matrices | rows | F.linear | (W @ x.T).T | oneDNN packed | mm / linear | packed / "
        "linear | packed bits = linear |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    g = torch.Generator().manual_seed(0)
    for name, shapes in (("layer", LAYER), ("head", HEAD)):
        ws = [torch.randn(o, i, generator=g).to(dtype) for o, i in shapes]
        for n in (int(r) for r in args.rows.split(",")):
            xs = [torch.randn(n, w.shape[1], generator=g).to(dtype) for w in ws]
            pk = [torch.ops.mkldnn._reorder_linear_weight(w, n) for w in ws]
            reps = args.reps if n * len(ws) < 2048 else max(3, args.reps // 5)
            lin = micros(lambda: [F.linear(x, w) for x, w in zip(xs, ws)], reps)  # noqa: B023
            mm = micros(lambda: [by_mm(x, w) for x, w in zip(xs, ws)], reps)  # noqa: B023
            pk_us = micros(lambda: [packed(x, p) for x, p in zip(xs, pk)], reps)  # noqa: B023
            same = all(torch.equal(F.linear(x, w), packed(x, p)) for x, w, p in zip(xs, ws, pk))
            print(
                f"| {name} | {n} | {lin:.0f} | {mm:.0f} | {pk_us:.0f} | {mm / lin:.2f}x | "
                f"{pk_us / lin:.2f}x | {'yes' if same else 'no'} |",
                flush=True,
            )
        t = time.perf_counter()
        chose, _ = measure(ws, ROWS if name == "layer" else HEAD_ROWS, packs=[pack(w) for w in ws])
        print(
            f"measuring the {name} at load (exact mode): {time.perf_counter() - t:.2f} s; "
            f"(W @ x.T).T chosen at rows {chose.fields()}, packed at {chose.packed_fields()}"
        )


if __name__ == "__main__":
    main()
