"""One linear layer's product at several row counts: exact mode's float32 against fast mode's
candidates (dense bfloat16, the packed int8 and int4 kernels, and where the CPU has AVX-512 VNNI
the integer products of ``engine.model.int_vnni``: columns int8v and int4v, their ratios to
torch's kernels after; int8t: the int8 ones on AMX's int8 tiles at every row count where the CPU
has them, the engine's from ``tiles_from()`` rows, its ratio to int8v last), on this CPU. Fast mode's kernel
switch (``engine.model.quant.SMALL_ROWS``) is read off this table.

The weight is the default model's fused gate/up matrix shape (3072 x 576); each figure is the
median of --runs timings of --iters calls, microseconds per call. Baseline: float32 as exact
mode computes it (``engine.model.llama.linear``), same run.

    .venv/bin/python bench/quant_kernels.py [--rows 1,2,4,8,16,32,64] [--runs 5]
    .venv/bin/python bench/quant_kernels.py --layers 30   # a decode step's products instead
    .venv/bin/python bench/quant_kernels.py --head --rows 1,4,8,16   # the LM head's

``--head``: the LM head's few-row products instead (49,152 x 576, as fast mode runs them up to
``VNNI_ROWS`` rows, each row's ``REFINE_TOP`` largest computed again from the dense values):
FBGEMM's integer product (``engine.model.vnni``) against the native one (``int8_vnni_mm``, on
AMX's tiles from ``tiles_from()`` rows where they are), both in float32 and refined, and the
dense values' product the model would run (``(W @ x.T).T``), microseconds per call.

``--layers N``: each figure is the time of N layers' four products in turn (the default model's
shapes: q/k/v 960x576, o 576x576, gate/up 3072x576, down 576x1536), every matrix in its own
memory as a decode step reads them, not one matrix the cache keeps between calls.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's engine, not another's

from engine.model.int_vnni import int_vnni_native, tiles_from  # noqa: E402
from engine.model.llama import linear  # noqa: E402
from engine.model.quant import QuantWeight  # noqa: E402
from kernels.cpu_ops import cpu_flags  # noqa: E402


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


# the default model's four products of one layer: q/k/v, o, gate/up, down
LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


class Mats:
    """One matrix in every form the table times."""

    NAMES = ("fp32", "bf16", "int8", "int4", "int8v", "int4v", "int8t")

    def __init__(self, w: torch.Tensor, ints: bool) -> None:
        self.w, self.dense16 = w, w.bfloat16()
        # small_rows large enough that every row count here takes the packed kernel
        self.q8 = QuantWeight(w, "int8", torch.bfloat16, 1 << 20)
        self.q4 = QuantWeight(w, "int4", torch.bfloat16, 1 << 20)
        self.q8v = QuantWeight(w, "int8", torch.bfloat16, 1 << 20, int_vnni=ints)
        self.q4v = QuantWeight(w, "int4", torch.bfloat16, 1 << 20, int_vnni=ints)
        assert self.q8.mode == "int8" and self.q4.mode == "int4"
        for plain, ours in ((self.q8, self.q8v), (self.q4, self.q4v)):  # each column's kernel
            assert plain.packed_form()[0].dim() == 2 and ours.packed_form()[0].dim() == (
                4 if ints else 2
            )

    def call(self, name: str, x: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
        """``x`` in float32 and, made before the timing, in bfloat16 (``xb``)."""
        if name == "fp32":
            return linear(x, self.w)
        if name == "bf16":
            return linear(xb, self.dense16)
        return getattr(self, "q" + name[3:].replace("t", "v")).packed_matmul(xb)


def run_all(mats: list[Mats], xs: dict[int, tuple[torch.Tensor, torch.Tensor]], name: str) -> None:
    # int8t on the tiles at every row count, int8v on the vector kernel at every row count
    set_tiles(1 if name == "int8t" else 0)
    for m in mats:
        m.call(name, *xs[m.w.shape[1]])


def set_tiles(rows: int) -> None:
    """int8 products of at least ``rows`` rows on AMX's tiles (0: none), where they exist."""
    if torch.ops.attest.int8_tiles_built():  # not tiles_from(): it reads the bound set here
        torch.ops.attest.set_int8_tiles_from(rows)


def head_table(rows: list[int], iters: int, runs: int) -> None:
    """The LM head's products both integer ways and dense (``--head``)."""
    from engine.model.orient import by_mm
    from engine.model.quant import VNNI_ROWS
    from engine.model.vnni import Int8Vnni

    w = torch.randn(49152, 576) * 0.05
    fb = QuantWeight(w, "int8", torch.bfloat16, 4, VNNI_ROWS)  # FBGEMM's
    ours = QuantWeight(w, "int8", torch.bfloat16, 4, VNNI_ROWS, int_vnni=True)  # the native ones
    assert isinstance(fb._packed, Int8Vnni) and fb.refined and ours.refined
    assert ours.integer, "the native head runs only where AMX's int8 tiles are"
    print(f"the LM head, 49152 x 576, us per call (median of {runs}); refined: 8 largest again")
    print(
        f"{'rows':>5} {'fbgemm':>9} {'native':>9} {'dense':>9}   fbgemm / native   dense / native"
    )
    for n in rows:
        x = torch.randn(n, 576).bfloat16()
        r = {
            "fbgemm": per_call_us(lambda: fb.packed_matmul(x), iters, runs),  # noqa: B023
            "native": per_call_us(lambda: ours.packed_matmul(x), iters, runs),  # noqa: B023
            "dense": per_call_us(lambda: by_mm(x, fb.dense), iters, runs),  # noqa: B023
        }
        print(
            f"{n:>5} {r['fbgemm']:>9.1f} {r['native']:>9.1f} {r['dense']:>9.1f}   "
            f"{r['fbgemm'] / r['native']:.2f}x   {r['dense'] / r['native']:.2f}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--out-features", type=int, default=3072)
    ap.add_argument("--in-features", type=int, default=576)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--layers", type=int, default=0, help="N layers' products (0: one matrix)")
    ap.add_argument("--head", action="store_true", help="the LM head's products instead")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.head:
        print(f"cpu: {describe()}; threads: {torch.get_num_threads()}")
        head_table([int(r) for r in args.rows.split(",")], max(1, args.iters // 20), args.runs)
        return
    ints = int_vnni_native(cpu_flags())
    engine_tiles = tiles_from()
    shapes = LAYER if args.layers else [(args.out_features, args.in_features)]
    mats = [Mats(torch.randn(n, k), ints) for _ in range(max(args.layers, 1)) for n, k in shapes]
    print(f"cpu: {describe()}; threads: {torch.get_num_threads()}")
    what = (
        f"{args.layers} layers' four products"
        if args.layers
        else f"one {args.out_features}x{args.in_features} product"
    )
    print(f"{what}, us per call (median of {args.runs})")
    v = "" if ints else " (no VNNI here: int8v is int8, int4v int4)"
    t = f"; the engine's tiles from {engine_tiles} rows" if engine_tiles else "; no tiles here"
    print(
        f"{'rows':>5} {'fp32':>8} {'bf16':>8} {'int8':>8} {'int4':>8} {'int8v':>8} {'int4v':>8}"
        f" {'int8t':>8}   best / fp32   int8 / int8v, int4 / int4v   int8v / int8t{v}{t}"
    )
    iters = max(1, args.iters // len(mats))
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {}
        for k in {m.w.shape[1] for m in mats}:
            x = torch.randn(rows, k)
            xs[k] = (x, x.bfloat16())
        calls = {name: partial(run_all, mats, xs, name) for name in Mats.NAMES}
        r = {name: per_call_us(fn, iters, args.runs) for name, fn in calls.items()}
        best = min(("bf16", "int8", "int4", "int8v", "int4v", "int8t"), key=r.get)
        cols = " ".join(f"{r[k]:>8.1f}" for k in Mats.NAMES)
        print(
            f"{rows:>5} {cols}   {best} {r['fp32'] / r[best]:.2f}x   "
            f"{r['int8'] / r['int8v']:.2f}x, {r['int4'] / r['int4v']:.2f}x   "
            f"{r['int8v'] / r['int8t']:.2f}x"
        )
    set_tiles(engine_tiles)


if __name__ == "__main__":
    main()
