"""The bfloat16 product on AMX's tiles (``kernels/cpu_dense.cpp``, the packed way of
``engine.model.orient`` on a CPU with the tiles; on a CPU without them, with AVX-512 BF16, the
native bfloat16 product on vectors, ``kernels/cpu_dense_vec.cpp``), or with ``--dtype float32``
the native float32 product (the same file, its packed way where the native ops are built with
AVX-512), against the ways it replaces, as a forward meets them: the default model's 30 layers'
four products (QKV 960x576, O 576x576, gate-up 3072x576, down 576x1536), each layer its own
random weights, so each product reads its weights from memory as a forward does, not from the
cache a repeated product keeps them in.

The ways, each over all 30 layers: ``F.linear`` (the baseline: transformers' call), ``(W @
x.T).T`` (``engine.model.orient.by_mm``: one row padded to two), oneDNN's linear on weights
reordered once (``mkldnn._reorder_linear_weight`` for 64 rows, as ``orient.pack`` laid them out
before the native products), and the native product on weights laid out once (``orient.pack``:
``attest::tile_pack`` or ``attest::pairs_pack``, or ``attest::f32_pack`` in float32). Per row
count: the fastest of --reps passes (milliseconds for the 30 layers), and the native product's
ratio over the fastest other way.

    .venv/bin/python bench/dense_tiles.py [--rows 1,16,64,128,512] [--reps 7] [--dtype float32]

With ``--gated``, the 30 layers' gate-up products and their activation only: the native
product then ``silu_mul`` (the baseline: the way before the gated layout) against the gated
product (``orient.gated_linear``: silu(gate) * up as the sums leave the tiles or registers),
whose bits it checks are the baseline's; the heap kept as the engine keeps it
(``engine.core.heap``), so that neither way's output is new memory each call.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

from engine.core.heap import keep_freed
from engine.model.fused import native_silu_mul
from engine.model.orient import (
    by_mm,
    dense_f32,
    dense_pairs,
    dense_tiles,
    gated_linear,
    on_f32,
    on_pairs,
    on_tiles,
    pack,
    packed_linear,
)
from kernels.timing import fastest, fastest_each

LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS = 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,64,128,512")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--gated", action="store_true", help="the gate-up products and activation")
    args = ap.parse_args()
    if args.gated:
        return gated(args)
    dtype = getattr(torch, args.dtype)
    print(f"cpu: {describe()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not (dense_tiles() or dense_pairs() if dtype == torch.bfloat16 else dense_f32()):
        raise SystemExit(f"no native {args.dtype} product here (or the native ops are not built)")
    g = torch.Generator().manual_seed(0)
    layers = [[torch.randn(o, i, generator=g).to(dtype) for o, i in LAYER] for _ in range(LAYERS)]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in ws] for ws in layers]
    tiles = [[pack(w) for w in ws] for ws in layers]
    ours = (on_tiles if dense_tiles() else on_pairs) if dtype == torch.bfloat16 else on_f32
    assert all(ours(p) for ps in tiles for p in ps)  # the native layout, not oneDNN's
    print(f"native: {ours.__name__[3:]}")
    ways = {
        "F.linear": lambda x, w, od, t: F.linear(x, w),
        "(W @ x.T).T": lambda x, w, od, t: by_mm(x, w),
        "oneDNN packed": lambda x, w, od, t: torch.ops.mkldnn._linear_pointwise(
            x, od, None, "none", [], ""
        ),
        "native": lambda x, w, od, t: packed_linear(x, t),
    }
    print(
        f"{LAYERS} layers' four {args.dtype} products, each layer its own weights; fastest of "
        f"{args.reps} passes, milliseconds"
    )
    print("| rows | " + " | ".join(ways) + " | native / fastest other |")
    print("|---:|" + "---:|" * (len(ways) + 1))
    for n in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(n, k, generator=g).to(dtype) for k in (576, 1536)}
        ms = {}
        for name, way in ways.items():

            def run(way=way, xs=xs) -> None:
                for ws, ods, ts in zip(layers, onednn, tiles):
                    for w, od, t in zip(ws, ods, ts):
                        way(xs[w.shape[1]], w, od, t)

            ms[name] = fastest(run, args.reps, warm=1) * 1e3
        other = min(v for k, v in ms.items() if k != "native")
        cells = " | ".join(f"{v:.2f}" for v in ms.values())
        print(f"| {n} | {cells} | {other / ms['native']:.2f}x |", flush=True)


def gated(args: argparse.Namespace) -> None:
    print(f"heap: {keep_freed()}")
    print(f"cpu: {describe()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not (dense_tiles() or dense_pairs()):
        raise SystemExit("no native bfloat16 product here (tiles or vectors)")
    g = torch.Generator().manual_seed(0)
    out, inp = LAYER[2]
    mats = [torch.randn(out, inp, generator=g).bfloat16() * 0.05 for _ in range(LAYERS)]
    plain = [pack(w) for w in mats]
    laid = [pack(w, gated=True) for w in mats]
    print(f"native: {'tiles' if on_tiles(laid[0]) else 'pairs'}")
    ways = {
        "native, then silu_mul": lambda x: [native_silu_mul(packed_linear(x, p)) for p in plain],
        "gated": lambda x: [gated_linear(x, p, native_silu_mul) for p in laid],
    }
    print(
        f"{LAYERS} layers' gate-up products and SiLU times up; fastest of {args.reps} each, "
        "the ways in turn, ms"
    )
    print("| rows | " + " | ".join(ways) + " | gated / baseline |")
    print("|---:|---:|---:|---:|")
    for n in (int(r) for r in args.rows.split(",")):
        x = torch.randn(n, inp, generator=g).bfloat16()
        a, b = ways["native, then silu_mul"](x), ways["gated"](x)
        assert all(torch.equal(u.view(torch.int16), v.view(torch.int16)) for u, v in zip(a, b))
        took = fastest_each([lambda f=f, x=x: f(x) for f in ways.values()], args.reps)
        ms = {k: t * 1e3 for k, t in zip(ways, took)}
        cells = " | ".join(f"{v:.2f}" for v in ms.values())
        print(f"| {n} | {cells} | {ms['native, then silu_mul'] / ms['gated']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
