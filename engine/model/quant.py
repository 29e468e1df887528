"""Fast mode: weight-only int8 / int4 linear layers, re-quantised at load.

The weights arrive in float32 from whatever the file holds (a GGUF's Q4_1 blocks are already
dequantised by the loader) and are quantised here once: int8 symmetric per output row, int4
asymmetric per group of 32 input columns. That is the layout of GGUF's Q4_1 blocks (a scale and
a minimum per 32 weights), so a Q4_1 file's values come back almost exactly; groups of 64 lost
enough that greedy agreement with exact mode fell to 71 % (int8: 96 %). torch 2.13's CPU int4
kernel runs group 32 as fast as 64 (27 us for one 3072x576 row, measured). Activations are
bfloat16 where the CPU has bfloat16 units.

Which kernel runs depends on how many rows a product has. Measured on this project's AVX-512
BF16 CPU, one 3072x576 product (see BENCHMARKS.md): the int8/int4 kernels read a quarter or an
eighth of the bytes and win while a product is bound by reading weights (1 row: 29 us against
114 us for bf16, 4 rows: 54 against 109); from about 8 rows on the product is bound by compute,
and a dense bfloat16 GEMM of the same dequantised values wins (16 rows: 112 us against 198,
64 rows: 326 against 832). So a quantised matrix keeps both: its packed form for products of at
most ``small_rows`` rows, and its dequantised values in bfloat16 for the rest. Both hold the
same quantised numbers; only the order of the sums differs. On a CPU the dense values are also
laid out once for oneDNN where the load measures that way faster for some row count
(``engine.model.orient``, as exact mode's weights are; ``dense_packed``): unpacked, a bfloat16
product lays them out again on every call. That copy costs their bytes again (``boot.weights``'
``prepacked`` says how many).

Where the CPU has integer dot products (VNNI) and the matrix is large (the LM head: int8 in both
modes, 28 M weights in the default model), its products of at most ``VNNI_ROWS`` rows are
FBGEMM's integer ones instead (``engine.model.vnni``: the same int8 values, activations
quantised to 8 bits per row; where AMX's int8 tiles are, the native integer products below,
faster at every count to 16: 16 rows of the head, refined, in 1.7 against 2.7 ms, BENCHMARKS.md), in
float32 as the logits are kept, and each row's ``REFINE_TOP`` largest entries are computed again
from the dense values (``refine_top``), so a greedy pick reads what the bfloat16 product would
give (8-bit activations alone moved held-out greedy agreement from 97.3 to 96.1 %; refined it
is 97.3 % again). Measured here, one row of the head in about 1.0 ms against 2.3 ms for the
packed int8 kernel, 16 rows in 3.2 against 5.7 ms for the dense values; from 32 rows the
refinement's top-k costs what the product saves. Smaller matrices keep the packed kernel
(BENCHMARKS.md).

On a CPU with AVX-512 VNNI (and the native ops built) the layer matrices' products of at most
``small_rows`` rows are native integer ones instead of torch's packed int4 / int8 kernels
(``engine.model.int_vnni``: the same values and scales, activations 8 bits per group of 32
columns). Measured on an Intel Xeon (BENCHMARKS.md): 3-4x faster per product at 1-16 rows, one
stream 1.6-1.8x tok/s for int8 and 1.3x for int4, greedy agreement unchanged. More rows keep the
dense values; where their bfloat16 GEMM catches up depends on the CPU (from about 8 rows on that
Xeon; on an AMD EPYC the load measured 16 to 256 rows, by mode and boot), so the layers' bound
is measured at load (``engine.model.int_rows``: ``SMALL_ROWS`` is its floor).

A CPU without bfloat16 units (AVX2 only) emulates bf16 products far slower than fp32, and
torch's int8/int4 kernels have no fast float32-activation path (580 us for one row, measured):
there the quantised values run dequantised in float32 with exact mode's kernels, never slower
than exact mode. The plan says which path runs; the boot receipt ``boot.weights`` records it.

The KV pool is bfloat16 where the native decode attention runs (``kernels.cpu_ops``: it reads
bfloat16 rows as cheaply as float32 ones, and half the bytes; greedy agreement stayed 96.5 % for
int8 and went from 98.8 to 98.4 % for int4) and float32 elsewhere (torch's batched products of
the grouped path ran bfloat16 four times slower: 89.7 against 403.7 tok/s at 16 streams).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.config import QUANTS
from engine.model.int_vnni import fits, int_vnni_native, pack_int4, pack_int8
from engine.model.int_vnni import tiles_from as int_tiles_from
from engine.model.vnni import Int8Vnni, vnni_native
from kernels import cpu_ops
from kernels.cpu_ops import cpu_flags

INT4_GROUPS = (32,)  # the first that divides a matrix's input width is used; none: int8
SMALL_ROWS = 4  # products of at most this many rows take the packed kernel
VNNI_ROWS = 16  # a large int8 matrix's products of at most this many rows take the VNNI product
# the weights from which an int8 matrix takes it: below, its fixed cost (about 60 us a product
# here, the activations' quantisation around FBGEMM's call) outweighs what it saves over the
# packed kernel (the LM head of the default model has 28 M; its largest layer matrix 1.8 M,
# where the two kernels tie at one row and the dense values win from 16; BENCHMARKS.md)
VNNI_MIN_WEIGHTS = 4 << 20
REFINE_TOP = 8  # a row's largest entries of an integer product computed again (``refine_top``)


def bf16_native(flags: frozenset[str]) -> bool:
    return bool({"avx512_bf16", "amx_bf16"} & flags)


@dataclass(slots=True)
class QuantPlan:
    """How fast mode runs on this CPU."""

    mode: str  # "int8" | "int4"
    dtype: torch.dtype  # the activations' (and the KV pool's) dtype
    small_rows: int  # products up to this many rows take the packed kernel; 0: never
    kernel: str  # what runs up to small_rows rows, in words ("": small_rows is 0)
    beyond: str  # what runs past them, and the rest of the plan, in words
    kv_dtype: torch.dtype = torch.float32  # the KV pool's (decode attention runs in it)
    vnni_rows: int = 0  # int8 matrices' products up to this many rows take the VNNI product
    int_vnni: bool = False  # the layer matrices' few-row products are the native integer ones
    # the layer matrices' bound measured at load (engine.model.int_rows): per row count, the
    # seconds of one layer's products in integers and in their dense values; empty: unmeasured
    int_rows: dict[int, tuple[float, float]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # matrices quantised, by kind
    packed_bytes: int = 0
    dense_bytes: int = 0
    seconds: float = 0.0

    @property
    def path(self) -> str:
        """What runs, in words, for the boot receipt and `engine info`."""
        if not self.small_rows:
            return self.beyond
        how = " (measured at load)" if self.int_rows else ""
        return f"{self.kernel} up to {self.small_rows} rows{how}, {self.beyond}"

    def fields(self) -> dict[str, object]:
        out: dict[str, object] = {
            "mode": self.mode,
            "dtype": str(self.dtype).removeprefix("torch."),
            "path": self.path,
            "small_rows": self.small_rows,
            "matrices": dict(self.counts),
            "packed_bytes": self.packed_bytes,
            "dense_bytes": self.dense_bytes,
            "quantize_s": round(self.seconds, 3),
            "kv_dtype": str(self.kv_dtype).removeprefix("torch."),
            "vnni_rows": self.vnni_rows,
            "int_vnni": self.int_vnni,
        }
        if self.int_rows:  # microseconds, integers then dense, by row count
            out["int_rows"] = {
                str(n): [round(a * 1e6, 1), round(b * 1e6, 1)]
                for n, (a, b) in self.int_rows.items()
            }
        return out


def plan_quant(
    mode: str, device: str, flags: frozenset[str] | None = None, native: bool | None = None
) -> QuantPlan:
    """Fast mode's plan for this CPU (``flags``) and whether the native ops run (``native``;
    None: as ``kernels.cpu_ops`` finds them)."""
    if mode not in QUANTS:
        raise ValueError(f"quant must be one of {', '.join(QUANTS)}, got {mode!r}")
    if not str(device).startswith("cpu"):
        raise ValueError(f"--quant {mode} runs on the CPU only (its kernels are torch's CPU ones)")
    flags = cpu_flags() if flags is None else flags
    vnni = VNNI_ROWS if vnni_native(flags) else 0
    ints = (
        f"; int8 matrices of {VNNI_MIN_WEIGHTS >> 20} M weights or more (the LM head): FBGEMM's "
        f"VNNI product up to {VNNI_ROWS} rows (activations 8 bits per row)"
        if vnni
        else ""
    )
    if bf16_native(flags):
        native = cpu_ops.load() if native is None else native
        kv = torch.bfloat16 if native else torch.float32
        layer_ints = bool(native) and int_vnni_native(flags)
        if vnni and native_head(layer_ints):  # as QuantWeight takes the head
            ints = (
                f"; int8 matrices of {VNNI_MIN_WEIGHTS >> 20} M weights or more (the LM head): "
                f"the native integer products up to {VNNI_ROWS} rows (activations 8 bits per "
                f"group of 32), each row's {REFINE_TOP} largest entries again from the dense values"
            )
        tiles = int_tiles_from() if layer_ints and mode == "int8" else 0
        kernel = (
            f"{mode} integer products (activations 8 bits per group of 32, AVX-512 VNNI"
            + (f"; AMX int8 tiles from {tiles} rows)" if tiles else ")")
            if layer_ints
            else f"{mode} packed kernel"
        )
        return QuantPlan(
            mode,
            torch.bfloat16,
            SMALL_ROWS,
            kernel,
            f"dense bfloat16 beyond (avx512_bf16 present){ints}; "
            f"{str(kv).removeprefix('torch.')} KV pool",
            kv_dtype=kv,
            vnni_rows=vnni,
            int_vnni=layer_ints,
        )
    return QuantPlan(
        mode,
        torch.float32,
        0,
        "",
        f"{mode} values dequantised to float32 (no bfloat16 units: packed kernels would be "
        f"slower than exact mode here){ints}",
        vnni_rows=vnni,
    )


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per output row: ``w ~= q * scale[:, None]``, q in [-127, 127]."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def int4_group(in_features: int) -> int | None:
    return next((g for g in INT4_GROUPS if in_features % g == 0), None)


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric per group of ``group`` input columns: ``w ~= q * scale + lo``, q in [0, 15].
    Returns q [N, K] (int32), scale and lo [N, K // group]."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
    return q.reshape(n, k), scale, lo


def native_head(int_vnni: bool) -> bool:
    """Whether a large int8 matrix (the LM head) takes the native integer products
    (``engine.model.int_vnni``) rather than FBGEMM's: where the layers' do (``int_vnni``) and
    AMX's int8 tiles are (faster than FBGEMM's there at every count to ``VNNI_ROWS``)."""
    return int_vnni and int_tiles_from() > 0


def top_indices(out: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of each row's ``k`` largest entries (a NaN above any number; of equal ones
    the first): the native op on the CPU (``attest::top_rows``, one pass of vector compares:
    70 us for 16 rows of 49,152 against 516 for torch's ``topk``, BENCHMARKS.md), else
    ``topk``'s (its choice among equal entries)."""
    if out.device.type == "cpu" and out.dtype == torch.float32 and out.stride(1) == 1:
        if cpu_ops.load():
            return torch.ops.attest.top_rows(out, k)
    return out.topk(k, dim=1, sorted=False).indices


class QuantWeight:
    """One weight-only quantised matrix ``[out, in]``: ``matmul(x)`` is ``x @ w.T``. Products of
    at most ``small_rows`` rows take ``packed_matmul`` (torch's int8 / int4 kernel, or for a
    large int8 matrix on a VNNI CPU the integer product of ``engine.model.vnni``), more its
    dense values (on a CPU, laid out for oneDNN in ``dense_packed`` where that was measured
    faster, as exact mode's weights are)."""

    __slots__ = (
        "mode",
        "shape",
        "small_rows",
        "dense",
        "dense_packed",
        "_packed",
        "_scales",
        "_group",
        "refined",
    )

    def __init__(
        self,
        w: torch.Tensor,
        mode: str,
        dtype: torch.dtype,
        small_rows: int,
        vnni_rows: int = 0,
        int_vnni: bool = False,
    ) -> None:
        self.shape = tuple(w.shape)
        group = int4_group(w.shape[1]) if mode == "int4" else None
        # the int4 packing wants whole 16-row tiles; no group or tile fits: int8
        self.mode = "int4" if group is not None and w.shape[0] % 16 == 0 else "int8"
        self._group = group or 0
        self.small_rows = small_rows  # the plan's: 0 without bfloat16 units
        self._packed = self._scales = None
        self.refined = False  # a few-row product's largest entries computed again (refine_top)
        if self.mode == "int8":
            q, scale = quantize_int8(w)
            values = q.float() * scale[:, None]
            if vnni_rows > 0 and w.numel() >= VNNI_MIN_WEIGHTS:  # the same values, in integers
                self.small_rows, self.refined = vnni_rows, True
                if native_head(int_vnni) and fits(*w.shape):
                    self._packed, self._scales = pack_int8(q, scale)  # the native ones
                else:
                    self._packed, self._scales = Int8Vnni(q, scale), scale
            elif small_rows > 0 and int_vnni and fits(*w.shape):
                self._packed, self._scales = pack_int8(q, scale)  # the same values, in integers
            elif small_rows > 0:  # the packed form is kept only where its kernel runs
                self._packed, self._scales = q, scale.to(dtype)
        else:
            q, scale, lo = quantize_int4(w, self._group)
            n, k = w.shape
            values = q.float().reshape(n, k // self._group, self._group) * scale[..., None]
            values = (values + lo[..., None]).reshape(n, k)
            if small_rows > 0 and int_vnni:  # the same values, in integers
                self._packed, self._scales = pack_int4(q, scale, lo)
            elif small_rows > 0:
                # the kernel computes (q - 8) * scale + zero, so zero = lo + 8 * scale
                sz = torch.stack([scale, lo + 8 * scale], dim=-1)  # [N, K/g, 2]
                self._scales = sz.transpose(0, 1).contiguous().to(dtype)  # [K/g, N, 2]
                self._packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        self.dense = values.to(dtype).contiguous()
        # oneDNN's layout of the dense values, where the load measured it faster for some row
        # count (``LlamaModel._orientations``); None: never packed
        self.dense_packed: torch.Tensor | None = None

    @property
    def packed_bytes(self) -> int:
        """What the packed form holds: the int8 or int4 values and their scales (FBGEMM's
        packing of the int8 values counted as their bytes and a scale each)."""
        if self._packed is None:
            return 0
        if isinstance(self._packed, Int8Vnni):
            return self.shape[0] * self.shape[1] + self._scales.numel() * 8
        return sum(t.numel() * t.element_size() for t in (self._packed, self._scales))

    def refine_top(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the integer product of ``x``) with each row's ``REFINE_TOP`` largest entries
        computed again from the dense values, as a product of more rows computes them: where
        8-bit activations reorder a near tie at the top (the next token of a greedy request),
        the order is the bfloat16 product's."""
        k = min(REFINE_TOP, out.shape[1])
        top = top_indices(out, k)  # [rows, k]
        exact = torch.bmm(self.dense[top], x.to(self.dense.dtype).unsqueeze(2)).squeeze(2)
        return out.scatter_(1, top, exact.to(out.dtype))

    @property
    def dense_bytes(self) -> int:
        return self.dense.numel() * self.dense.element_size()

    @property
    def integer(self) -> bool:
        """Whether its few-row products are ``engine.model.int_vnni``'s integer ones."""
        p = self._packed
        return p is not None and not isinstance(p, Int8Vnni) and p.dim() == 4

    def packed_form(self) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """(values, scales, group) of torch's packed int8 / int4 kernel, as ``packed_matmul``
        passes them; None where that kernel does not run (no packed form, or the VNNI one)."""
        if self._packed is None or isinstance(self._packed, Int8Vnni):
            return None
        return self._packed, self._scales, self._group

    def packed_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w.T`` by the packed form, in ``x``'s dtype; a refined matrix's (the LM head's)
        in float32, as the logits are kept."""
        if isinstance(self._packed, Int8Vnni):  # refined (the head's only)
            return self.refine_top(x, self._packed.matmul(x))
        if self.integer:  # engine.model.int_vnni's layouts (torch's have 2 dimensions)
            op = (
                torch.ops.attest.int8_vnni_mm
                if self.mode == "int8"
                else torch.ops.attest.int4_vnni_mm
            )
            if not self.refined:
                return op(x, self._packed, self._scales)
            # float32 rows give the same integers, and float32 out
            return self.refine_top(x, op(x.float(), self._packed, self._scales))
        if self.mode == "int8":
            return torch.ops.aten._weight_int8pack_mm(x, self._packed, self._scales)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self._packed, self._group, self._scales
        )


def quantize_weight(w: torch.Tensor, plan: QuantPlan, mode: str | None = None) -> QuantWeight:
    """``w`` quantised by the plan (``mode`` overrides it: the LM head is int8 in both modes),
    counted in the plan."""
    t = time.perf_counter()
    qw = QuantWeight(
        w, mode or plan.mode, plan.dtype, plan.small_rows, plan.vnni_rows, plan.int_vnni
    )
    plan.counts[qw.mode] = plan.counts.get(qw.mode, 0) + 1
    plan.packed_bytes += qw.packed_bytes
    plan.dense_bytes += qw.dense_bytes
    plan.seconds += time.perf_counter() - t
    return qw
