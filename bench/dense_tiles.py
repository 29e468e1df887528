"""The bfloat16 product on AMX's tiles (``kernels/cpu_dense.cpp``, the packed way of
``engine.model.orient`` on a CPU with the tiles) against the ways it replaces, as a forward
meets them: the default model's 30 layers' four products (QKV 960x576, O 576x576, gate-up
3072x576, down 576x1536), each layer its own random weights, so each product reads its weights
from memory as a forward does, not from the cache a repeated product keeps them in.

The ways, each over all 30 layers: ``F.linear`` (the baseline: transformers' call), ``(W @
x.T).T`` (``engine.model.orient.by_mm``: one row padded to two), oneDNN's linear on weights
reordered once (``mkldnn._reorder_linear_weight`` for 64 rows, as ``orient.pack`` laid them out
before the tiles), and the tiles' product on weights laid out once (``attest::tile_pack``). Per
row count: the fastest of --reps passes (milliseconds for the 30 layers), and the tiles' ratio
over the fastest other way.

    .venv/bin/python bench/dense_tiles.py [--rows 1,16,64,128,512] [--reps 7]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

from engine.model.orient import by_mm, dense_tiles, on_tiles, pack
from kernels.timing import fastest

LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS = 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,64,128,512")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    print(f"cpu: {describe()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not dense_tiles():
        raise SystemExit("no AMX bfloat16 tiles here (or the native ops are not built)")
    g = torch.Generator().manual_seed(0)
    layers = [
        [torch.randn(o, i, generator=g).to(torch.bfloat16) for o, i in LAYER] for _ in range(LAYERS)
    ]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in ws] for ws in layers]
    tiles = [[pack(w) for w in ws] for ws in layers]
    assert all(on_tiles(p) for ps in tiles for p in ps)  # the tiles' layout, not oneDNN's
    ways = {
        "F.linear": lambda x, w, od, t: F.linear(x, w),
        "(W @ x.T).T": lambda x, w, od, t: by_mm(x, w),
        "oneDNN packed": lambda x, w, od, t: torch.ops.mkldnn._linear_pointwise(
            x, od, None, "none", [], ""
        ),
        "tiles": lambda x, w, od, t: torch.ops.attest.tile_linear(x, t),
    }
    print(
        f"{LAYERS} layers' four bfloat16 products, each layer its own weights; fastest of "
        f"{args.reps} passes, milliseconds"
    )
    print("| rows | " + " | ".join(ways) + " | tiles / fastest other |")
    print("|---:|" + "---:|" * (len(ways) + 1))
    for n in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(n, k, generator=g).to(torch.bfloat16) for k in (576, 1536)}
        ms = {}
        for name, way in ways.items():

            def run(way=way, xs=xs) -> None:
                for ws, ods, ts in zip(layers, onednn, tiles):
                    for w, od, t in zip(ws, ods, ts):
                        way(xs[w.shape[1]], w, od, t)

            ms[name] = fastest(run, args.reps, warm=1) * 1e3
        other = min(v for k, v in ms.items() if k != "tiles")
        cells = " | ".join(f"{v:.2f}" for v in ms.values())
        print(f"| {n} | {cells} | {other / ms['tiles']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
