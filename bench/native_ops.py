"""The native CPU ops (kernels/cpu_ops.cpp) against the torch ops they stand in for, per call.

Small ops: RMSNorm, add+RMSNorm, rotary and SiLU times up at ``--rows`` (1, 64 and a prefill's
512 by default), float32 and bfloat16, on dense inputs of the default model's widths; greedy
sampling's argmax over float32 logits of its vocabulary (torch's ``max``, the sampler's before). Decode attention: the tensors of real decode forwards (an engine decoding ``--batch``
requests of 128-token prompts, 30 layers' calls captured once the context passed 140 tokens),
replayed through the native and the grouped paths; "hot" repeats them back to back, "cold" first
streams 160 MB through the caches, as a forward does between one layer's attention and the next
step's. The native ops must be built (``make native``); the figures are medians in us.

    .venv/bin/python bench/native_ops.py [--rows 1,64,512] [--batch 1,16,64] [--quant exact|int8|int4]
    .venv/bin/python bench/native_ops.py --rows 512 --batch ''   # the small ops only
    .venv/bin/python bench/native_ops.py --rows '' --batch '' --extend 512,2048   # a prompt's attention

A prompt's attention (``--extend``): one fresh prompt of each length through the native extend
kernel each way this CPU runs it (the laid-out method on AMX's tiles or on AVX-512 BF16 vectors,
the item loops), against SDPA's flash kernel (medians in us).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's engine, not another


def per_call_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def op_pairs(rows: int, dtype: torch.dtype) -> dict:
    """Per op: (torch's, the native one), as calls on dense inputs of ``rows`` rows."""
    from engine.model.fused import add_norm, apply_rope, rms_norm, silu_mul

    ops = torch.ops.attest
    x, y = torch.randn(rows, 576).to(dtype), torch.randn(rows, 576).to(dtype)
    w, h = torch.randn(576).to(dtype), x.clone()
    qk = torch.randn(rows, 12, 64).to(dtype)
    freqs = torch.arange(rows).float()[:, None] * torch.rand(32)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]
    gate_up = torch.randn(rows, 2 * 1536).to(dtype)
    pairs = {
        "rms_norm": (lambda: rms_norm(x, w, 1e-5), lambda: ops.rms_norm(x, w, 1e-5)),
        "add_norm": (lambda: add_norm(x, y, w, 1e-5), lambda: ops.add_rms_norm(h, y, w, 1e-5)),
        "rope": (lambda: apply_rope(qk, cos, sin), lambda: ops.rope_(qk, cos, sin)),
        "silu_mul": (lambda: silu_mul(gate_up), lambda: ops.silu_mul(gate_up)),
    }
    if dtype == torch.float32:  # greedy sampling: the logits are float32 in every mode
        logits = torch.randn(rows, 49152)
        pairs["argmax"] = (
            lambda: logits.max(dim=-1).indices,
            lambda: ops.argmax_rows(logits),
        )
        # the LM head's refined entries (engine.model.quant.top_indices): each row's 8 largest
        pairs["top8"] = (
            lambda: logits.topk(8, dim=1, sorted=False).indices,
            lambda: ops.top_rows(logits, 8),
        )
    return pairs


def small_ops(counts: list[int]) -> None:
    """Per op: torch's and the native one alternating, five times; the medians."""
    print("op, rows, dtype: torch us / native us (medians of 5, alternating)")
    for dtype in (torch.float32, torch.bfloat16):
        for rows in counts:
            n = max(20, 20000 // rows)
            for name, (ref, native) in op_pairs(rows, dtype).items():
                a, b = [], []
                for _ in range(5):
                    a.append(per_call_us(ref, n))
                    b.append(per_call_us(native, n))
                a_us, b_us = statistics.median(a), statistics.median(b)
                print(
                    f"  {name}, {rows}, {str(dtype)[6:]}: {a_us:.1f} / {b_us:.1f} ({a_us / b_us:.2f}x)"
                )


def captured(batch: int, quant: str | None) -> list[tuple]:
    """The arguments of one decode forward's 30 attention calls at ``batch`` requests."""
    from engine import LLM, SamplingParams
    from measure.method import Prompts

    llm = LLM(
        kv_tokens=batch * 168, max_running=batch, receipts=False, quant=quant, speculative="off"
    )
    backend = llm.core.scheduler.runner.model.backend
    calls, real = [], backend.forward

    def keep(q, k, v, kv, meta, scale):
        if meta.is_decode and len(meta.req_rows) == batch and min(meta.prefix_lens) >= 140:
            if len(calls) < llm.core.model_config.num_layers:
                calls.append((q.clone(), k.clone(), v.clone(), kv, meta, scale))
        return real(q, k, v, kv, meta, scale)

    backend.forward = keep
    prompts = Prompts(llm.core.model_config.vocab_size).take(batch, 128)
    llm.generate(prompts, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    backend.forward = real
    return calls


def attention(batches: list[int], quant: str | None) -> None:
    from kernels.torch_ref import TorchReferenceBackend

    junk = torch.ones(40_000_000)  # 160 MB, more than the last-level cache
    for batch in batches:
        calls = captured(batch, quant)
        q, kv, meta = calls[0][0], calls[0][3], calls[0][4]
        line = [
            f"batch {batch}, context {max(meta.prefix_lens) + 1}, {str(q.dtype)[6:]} "
            f"activations, {str(kv.k.dtype)[6:]} pool:"
        ]
        for path in ("grouped", "native"):
            backend = TorchReferenceBackend(path)
            for cold in (False, True):
                times = []
                for _ in range(3):
                    for q, k, v, kv, meta, scale in calls:
                        meta.scratch.clear()  # each call builds its plan, as a forward's first
                        if cold:
                            junk.add_(1.0)
                        t = time.perf_counter()
                        backend.forward(q, k, v, kv, meta, scale)
                        times.append(time.perf_counter() - t)
                line.append(
                    f"{path} {'cold' if cold else 'hot'} {statistics.median(times) * 1e6:.0f}"
                )
        print("  " + ", ".join(line[1:]), "us |", line[0])


def extend_row(n: int, ways: list[str]) -> str:
    """One fresh prompt of ``n`` tokens (the default model's heads: 9 query heads, 3 KV heads of
    64; bfloat16 queries over a bfloat16 pool): its table row, a column for each way of
    ``cpu_ops.EXTEND_BF16_WAYS`` (nan where the CPU does not run it)."""
    from kernels import cpu_ops

    heads, kv_heads, d = 9, 3, 64
    g = torch.Generator().manual_seed(n)
    q = torch.randn(n, heads, d, generator=g).to(torch.bfloat16)
    k = torch.randn(n, kv_heads, d, generator=g).to(torch.bfloat16)
    v = torch.randn(n, kv_heads, d, generator=g).to(torch.bfloat16)
    slots, zero, ext = torch.arange(n)[None], torch.tensor([0]), torch.tensor([n])
    qs = q.transpose(0, 1)[None]
    ks, vs = (t.repeat_interleave(heads // kv_heads, 1).transpose(0, 1)[None] for t in (k, v))

    def median_us(fn) -> float:
        return statistics.median(per_call_us(fn, n=1) for _ in range(7))

    def native(way: str) -> float:
        if way not in ways:
            return float("nan")
        was = torch.ops.attest.set_extend_way(way)
        try:
            return median_us(
                lambda: torch.ops.attest.extend_attention(q, k, v, slots, zero, zero, ext, d**-0.5)
            )
        finally:
            torch.ops.attest.set_extend_way(was)

    sdpa = median_us(
        lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    )
    took = [native(way) for way in cpu_ops.EXTEND_BF16_WAYS]
    return (
        "| "
        + " | ".join(
            [
                str(n),
                f"{sdpa:.0f}",
                *(f"{t:.0f}" for t in took),
                *(f"{sdpa / t:.2f}x" for t in took),
            ]
        )
        + " |"
    )


def extend(lengths: list[int]) -> None:
    """A fresh prompt's attention a layer: the native kernel each way this CPU runs a bfloat16
    chunk (``attest::set_extend_way``: the laid-out method on AMX's tiles, on AVX-512 BF16
    vectors, the item loops), and SDPA's flash kernel over the context gathered as the torch path
    does (the baseline); medians of 7 calls."""
    from kernels import cpu_ops

    ways = cpu_ops.extend_ways()
    print(
        "| prefill tokens | SDPA us | "
        + " | ".join(f"native, {w} us" for w in cpu_ops.EXTEND_BF16_WAYS)
        + " | "
        + " | ".join(f"SDPA / {w}" for w in cpu_ops.EXTEND_BF16_WAYS)
        + " |"
    )
    print("|---:" * (2 + 2 * len(cpu_ops.EXTEND_BF16_WAYS)) + "|")
    for n in lengths:
        print(extend_row(n, ways), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,64,512", help="the small ops' row counts")
    ap.add_argument("--batch", default="1,16,64", help="decode attention's batches; '': none")
    ap.add_argument("--quant", choices=("exact", "int8", "int4"), default="int4")
    ap.add_argument("--extend", default="", help="a fresh prompt's attention at these lengths")
    args = ap.parse_args()
    from kernels import cpu_ops

    if not cpu_ops.load():
        raise SystemExit(f"bench/native_ops.py: {cpu_ops.why_not()}")
    print(f"cpu: {describe()}; threads: {torch.get_num_threads()}")
    if args.extend:
        extend([int(n) for n in args.extend.split(",")])
    if args.rows:
        small_ops([int(r) for r in args.rows.split(",")])
    if args.batch:
        print(f"decode attention, {args.quant} engine: grouped vs native, hot and cold")
        attention(
            [int(b) for b in args.batch.split(",")], None if args.quant == "exact" else args.quant
        )


if __name__ == "__main__":
    main()
