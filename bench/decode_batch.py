"""Batched decode in exact mode (float32): Attest's grouped paged decode against its earlier padded
decode (`--attention-backend torch-padded`) and transformers' batched generate, in one run.

For each stream count N: N random prompts of --prompt-len tokens, greedy, EOS ignored. An arm's
decode rate is N * new_tokens / (t(new_tokens + 1 tokens) - t(1 token)), each generate on its own
fresh prompts: the prefill and first token are timed apart and taken out. Every Attest prompt,
warm-ups included, starts with a token no earlier prompt had, the prefix cache is emptied before
each timed generate, and every request's `request.finish` receipt is asserted to show
cached == 0: a prefill served from the cache is not work. Figures are medians of --runs runs,
the arms alternated within each run so machine drift hits them alike.

    .venv/bin/python bench/decode_batch.py [--streams 1,16,32,64] [--runs 3] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

BEFORE, AFTER, HF = "attest torch-padded (before)", "attest torch (after)", "transformers"


class Prompts:
    """Fresh random prompts; the first token of each is new, so no two share a prefix."""

    def __init__(self, vocab: int, length: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.firsts = iter(range(1000, vocab))
        self.vocab, self.length = vocab, length

    def take(self, n: int) -> list[list[int]]:
        return [
            [
                next(self.firsts),
                *(self.rng.randrange(3, self.vocab) for _ in range(self.length - 1)),
            ]
            for _ in range(n)
        ]


def attest_arm(llm, prompts: Prompts):
    from engine import SamplingParams

    def go(n: int, new: int) -> float:
        ids = prompts.take(n)
        llm.core.scheduler.cache.reset_to_empty()
        params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate(ids, params)
        dt = time.perf_counter() - t
        assert all(len(o.token_ids) == new for o in outs)
        fins = llm.core.receipts.of("request.finish")[-n:]
        assert len(fins) == n and all(f["cached"] == 0 for f in fins), "a prefix-cache hit"
        return dt

    return go


def hf_arm(hf, prompts: Prompts):
    def go(n: int, new: int) -> float:
        x = torch.tensor(prompts.take(n))
        kw = dict(attention_mask=torch.ones_like(x), do_sample=False, top_p=None, top_k=None)
        with torch.inference_mode():
            t = time.perf_counter()
            out = hf.generate(x, max_new_tokens=new, min_new_tokens=new, **kw)
            dt = time.perf_counter() - t
        assert out.shape == (n, x.shape[1] + new)
        return dt

    return go


def decode_rate(go, n: int, new: int) -> tuple[float, float]:
    """(decode tok/s, end-to-end output tok/s) of one run of ``n`` streams."""
    first = go(n, 1)
    full = go(n, new + 1)
    return n * new / (full - first), n * (new + 1) / full


def load_transformers(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,16,32,64")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-baseline", action="store_true", help="skip transformers")
    args = ap.parse_args()
    streams = [int(s) for s in args.streams.split(",")]

    from engine import LLM

    most = max(streams)
    kv = most * (args.prompt_len + args.new_tokens + 8) + 64
    engines = {
        name: LLM(attention_backend=backend, kv_tokens=kv, max_running=most)
        for name, backend in ((BEFORE, "torch-padded"), (AFTER, "torch"))
    }
    vocab = engines[AFTER].core.model_config.vocab_size
    arms = {name: attest_arm(llm, Prompts(vocab, args.prompt_len, i))
            for i, (name, llm) in enumerate(engines.items())}  # fmt: skip
    if not args.no_baseline:
        arms[HF] = hf_arm(load_transformers(engines[AFTER].core.loaded.path),
                          Prompts(vocab, args.prompt_len, 9))  # fmt: skip

    load_before = os.getloadavg()[0]
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for n in streams:
        for go in arms.values():
            go(n, 4)  # warm-up at this batch size
        for _ in range(args.runs):
            for name, go in arms.items():
                results.setdefault((name, n), []).append(decode_rate(go, n, args.new_tokens))

    print(f"\ncpu: {describe()}")
    print(f"threads: {torch.get_num_threads()}, load average before/after: "
          f"{load_before:.2f}/{os.getloadavg()[0]:.2f}, runs: {args.runs}")  # fmt: skip
    print(f"prompts: {args.prompt_len} random tokens, {args.new_tokens} new tokens, greedy; "
          "every Attest request asserted cached_tokens == 0")  # fmt: skip
    print("decode tok/s (median; end-to-end output tok/s incl. prefill in brackets)")
    head = f"{'streams':>7} " + " ".join(f"{a:>30}" for a in arms)
    print(head + f" {'after/before':>13}" + (f" {'after/transformers':>19}" if HF in arms else ""))
    for n in streams:
        med = {a: (statistics.median(r[0] for r in results[a, n]),
                   statistics.median(r[1] for r in results[a, n])) for a in arms}  # fmt: skip
        cells = " ".join(f"{med[a][0]:>20.1f} ({med[a][1]:>6.1f})" for a in arms)
        line = f"{n:>7} {cells} {med[AFTER][0] / med[BEFORE][0]:>12.2f}x"
        if HF in arms:
            line += f" {med[AFTER][0] / med[HF][0]:>18.2f}x"
        print(line)
    print("runs (decode tok/s):")
    for (a, n), rs in results.items():
        print(f"  {a}, {n} streams: {[round(r[0], 1) for r in rs]}")


if __name__ == "__main__":
    main()
