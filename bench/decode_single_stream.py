"""Single-stream decode and 512-token prefill: Attest's LLM.generate vs transformers' generate.

Both load the same default GGUF (float32). Each figure is the median of --runs runs, measured in
this process, alternating engine and baseline; the ratio is Attest / transformers.

Every Attest run, warm-up included, gets a prompt it has never seen (its first token differs),
and the run asserts from its `request.finish` receipt that nothing came from the prefix cache:
a prefill served from the cache is not prefill work. Attest's decode rate is read from the same
receipt (tokens after the first over e2e - ttft), not from a second, cached, generate.

    .venv/bin/python bench/decode_single_stream.py [--runs 3] [--new-tokens 128] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script


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
    llm = LLM(dtype=args.dtype, kv_tokens=4096, max_running=4, speculative="off")
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
    firsts = iter(range(1000, llm.core.scheduler.runner.model.cfg.vocab_size))

    def unseen(ids: list[int]) -> list[int]:
        """``ids`` with a first token no earlier run had: the prefix cache cannot match it."""
        return [next(firsts), *ids[1:]]

    def finished_uncached(ids: list[int], new: int) -> dict:
        """Generate ``new`` tokens after ``ids``; its finish receipt, asserted cache-free."""
        out = llm.generate([ids], SamplingParams(max_tokens=new, temperature=0, ignore_eos=True))
        fin = llm.core.receipts.of("request.finish")[-1]
        assert len(out[0].token_ids) == new and fin["tokens"] == new, fin
        assert fin["cached"] == 0, f"a timed run hit the prefix cache: {fin}"
        return fin

    def attest_decode() -> float:
        fin = finished_uncached(unseen(prompt), n + 1)
        return n / (fin["e2e_s"] - fin["ttft_s"])

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
        ids = unseen(long_prompt)
        t = time.perf_counter()
        finished_uncached(ids, 1)
        return len(ids) / (time.perf_counter() - t)

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
    print(f"cpu: {describe()}")
    print("prefix cache: every timed Attest run asserted cached_tokens == 0")
    print(f"load seconds: attest {attest_load:.1f}, transformers {hf_load:.1f}")
    print(f"{'measure':<32} {'attest':>10} {'transformers':>13} {'ratio':>7}")
    for name, ma, mb, r, a, b in rows:
        print(
            f"{name:<32} {ma:>10.1f} {mb:>13.1f} {r:>6.2f}x   (attest {[round(x, 1) for x in a]}, transformers {[round(x, 1) for x in b]})"
        )


if __name__ == "__main__":
    main()
