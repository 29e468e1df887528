"""Up to how many rows fast mode's layer matrices take the native integer products, measured at
load.

A quantised matrix keeps two forms (``engine.model.quant``): the integer products of
``engine.model.int_vnni`` for products of a few rows and the dense bfloat16 values for the
rest. Where the dense product catches up depends on the CPU, and this machine kind's CPU
changes. On an Intel Xeon with AMX the dense values were about as fast from 8 rows on and faster
from 16 (one 3072 x 576 product: 45.0 us in integers against 61.7 dense at 8 rows, 91.8 against
61.3 at 16). On an AMD EPYC with AVX-512 BF16 and no AMX the integer products stayed ahead far
longer (116 us against 160 at 16 rows). There, with the bound measured, int4 decoded 2.01x
faster at 8 streams than with the bound of 4 and 1.35x at 64 (BENCHMARKS.md). A bound fixed for
one CPU is wrong on the other.

So the model times its layers' products both ways, its own matrices in their own dtype, at
each of ``ROWS`` (the dense way as ``engine.model.orient`` chose it, the dense values' packed
copy among the ways): every layer's four products a pass, each matrix read once, as a forward
reads them from memory. One layer's four timed again and again stay in the cache, where the
bytes the integer form saves count for nothing: timed so on an Intel Xeon with AMX, the dense
values on AMX's bfloat16 tiles caught up at 8 rows (216 us against 226) and passed at 16 (222
against 285), and that bound of 8 decoded 16 streams at 750 and 819 tok/s, the bound of 16
measured over every layer at 888 and 885 (BENCHMARKS.md). The bound is the last row count in an unbroken run of counts where
the integer products were faster, counted from ``SMALL_ROWS`` up. A product between two counts
takes the lower one's way. ``SMALL_ROWS`` itself is the floor: the integer products win there on
both CPUs (3-4x). The one native decode call (``engine.model.native_step``) takes the integer
products up to the bound and the dense values past it, as the Python layers do.

It runs only where every layer matrix has the integer form, on one rank and one stage. The
speculator sizes its steps by the bound (each drafted row computed as one row would be), and a
rank or stage that measured its own bound could compute a row another way than the one that
drafts. ``ATTEST_INT_ROWS=N`` fixes the bound instead (4, the bound of before, to measure
against; the test suite fixes it so that two boots in one test compute alike).
``boot.weights`` records the bound (``small_rows``) and what was timed (``int_rows``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from engine.group.comm import Comm
from engine.group.pipeline import Stage
from engine.model.quant import SMALL_ROWS, QuantPlan, QuantWeight
from kernels.timing import fastest_each

ROWS = (SMALL_ROWS, 8, 16, 32, 64, 128, 256)  # the row counts timed, from the floor up

# x, the matrix -> x @ w.T from its dense values, the way the model runs them
Dense = Callable[[torch.Tensor, QuantWeight], torch.Tensor]


def measure(
    mats: Sequence[QuantWeight],
    dense: Dense,
    rows: tuple[int, ...] = ROWS,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[int, dict[int, tuple[float, float]]]:
    """The bound for ``mats`` (their products of ``n`` rows timed together, in integers and
    through ``dense``), with the seconds each way took, ``{n: (integers, dense)}``. The timing
    stops at the first count above ``rows[0]`` that the integer products lose."""
    g = torch.Generator().manual_seed(0)
    took: dict[int, tuple[float, float]] = {}
    bound = rows[0]
    for n in rows:
        xs = [torch.randn(n, w.shape[1], generator=g).to(w.dense.dtype) for w in mats]
        ints, flat = fastest_each(
            [
                lambda: [w.packed_matmul(x) for x, w in zip(xs, mats)],  # noqa: B023
                lambda: [dense(x, w) for x, w in zip(xs, mats)],  # noqa: B023
            ],
            clock=clock,
        )
        took[n] = (ints, flat)
        if n > rows[0] and ints >= flat:
            break
        bound = n
    return bound, took


def choose(
    mats: Sequence[QuantWeight], dense: Dense, rows: tuple[int, ...] | None = None
) -> tuple[int, dict[int, tuple[float, float]]]:
    """``measure``'s bound, unless ``ATTEST_INT_ROWS`` fixes one (then nothing is timed)."""
    how = os.environ.get("ATTEST_INT_ROWS", "").strip()
    if how in ("", "measure"):
        return measure(mats, dense, ROWS if rows is None else rows)
    if how.isdigit() and int(how) >= 1:
        return int(how), {}
    raise ValueError(f"ATTEST_INT_ROWS must be a row count (1 or more) or measure, got {how!r}")


class Widened(Protocol):
    """What the bound is set on (``LlamaModel``, which calls ``widen`` at load and so cannot be
    imported here): its layers' matrices and its quant plan, one rank and one stage only."""

    quant: QuantPlan | None
    comm: Comm
    stage: Stage
    layers: list[dict[str, Any]]  # a layer's weights by name: tensors, quantised matrices


def widen(model: Widened, matrices: Sequence[str], dense: Dense) -> None:
    """Set the bound of ``model``'s (a ``LlamaModel``'s) layer matrices and its quant plan, where
    it applies (see the module's doc); elsewhere they keep ``SMALL_ROWS``."""
    plan = model.quant
    if plan is None or not plan.int_vnni or not model.layers:
        return
    if model.comm.world > 1 or model.stage.count > 1:
        return
    mats = [layer[k] for layer in model.layers for k in matrices]
    if not all(isinstance(w, QuantWeight) and w.integer for w in mats):
        return
    bound, took = choose(mats, dense)  # every layer's: read from memory, as a forward does
    for w in mats:
        w.small_rows = bound
    plan.small_rows, plan.int_rows = bound, took
