"""Single-stream decode and 512-token prefill: Attest's LLM.generate vs transformers' generate.

Both load the same default GGUF (float32). Each figure is the median of --runs runs, measured in
this process, alternating engine and baseline; the ratio is Attest / transformers.

    .venv/bin/python bench/decode_single_stream.py [--runs 3] [--new-tokens 128] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from engine import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(dtype=args.dtype, kv_tokens=4096, max_running=4)
    attest_load = time.perf_counter() - t0
    path = llm.core.loaded.path
    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=getattr(torch, args.dtype)
    ).eval()
    hf_load = time.perf_counter() - t0

    prompt = llm.tokenizer.encode("The history of the printing press")
    n = args.new_tokens
    long_prompt = (llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. ") * 64)[
        : args.prefill_tokens
    ]

    def attest_decode() -> float:
        p = SamplingParams(max_tokens=n + 1, temperature=0, ignore_eos=True)
        t = time.perf_counter()
        llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0))  # prefill alone
        t_prefill = time.perf_counter() - t
        t = time.perf_counter()
        out = llm.generate([prompt], p)[0]
        total = time.perf_counter() - t
        assert len(out.token_ids) == n + 1
        return n / (total - t_prefill)

    def hf_decode() -> float:
        x = torch.tensor([prompt])
        kw = dict(attention_mask=torch.ones_like(x), do_sample=False, top_p=None, top_k=None)
        with torch.inference_mode():
            t = time.perf_counter()
            hf.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
            t_prefill = time.perf_counter() - t
            t = time.perf_counter()
            out = hf.generate(x, max_new_tokens=n + 1, min_new_tokens=n + 1, **kw)
            total = time.perf_counter() - t
        assert out.shape[1] == len(prompt) + n + 1
        return n / (total - t_prefill)

    def attest_prefill() -> float:
        t = time.perf_counter()
        llm.generate([long_prompt], SamplingParams(max_tokens=1, temperature=0))
        return len(long_prompt) / (time.perf_counter() - t)

    def hf_prefill() -> float:
        x = torch.tensor([long_prompt])
        with torch.inference_mode():
            t = time.perf_counter()
            hf(x)
            return len(long_prompt) / (time.perf_counter() - t)

    rows = []
    for name, ours, base in (
        ("decode, 1 stream (tok/s)", attest_decode, hf_decode),
        (f"prefill {len(long_prompt)} tokens (tok/s)", attest_prefill, hf_prefill),
    ):
        ours(), base()  # warm-up
        a, b = [], []
        for _ in range(args.runs):
            a.append(ours())
            b.append(base())
        ma, mb = statistics.median(a), statistics.median(b)
        rows.append((name, ma, mb, ma / mb, a, b))

    print(
        f"\nmodel: {path}\ndtype: {args.dtype}, threads: {torch.get_num_threads()}, runs: {args.runs}"
    )
    print(f"load seconds: attest {attest_load:.1f}, transformers {hf_load:.1f}")
    print(f"{'measure':<32} {'attest':>10} {'transformers':>13} {'ratio':>7}")
    for name, ma, mb, r, a, b in rows:
        print(
            f"{name:<32} {ma:>10.1f} {mb:>13.1f} {r:>6.2f}x   (attest {[round(x, 1) for x in a]}, transformers {[round(x, 1) for x in b]})"
        )


if __name__ == "__main__":
    main()
