"""Batched decode in exact mode (float32): Attest's grouped paged decode against its earlier padded
decode (`--attention-backend torch-padded`) and transformers' batched generate, in one run.

For each stream count N: N random prompts of --prompt-len tokens, greedy, EOS ignored. The method
is measure/method.py's (also `engine bench --table`'s): an arm's decode rate is
N * new_tokens / (t(new_tokens + 1 tokens) - t(1 token)), each generate on its own fresh
prompts, so the prefill and first token are timed apart and taken out; every Attest prompt,
warm-ups included, starts with a token no earlier prompt had, the prefix cache is emptied before
each timed generate, and every request's `request.finish` receipt is asserted to show
cached == 0. Figures are medians of --runs runs, the arms alternated within each run so machine
drift hits them alike.

    .venv/bin/python bench/decode_batch.py [--streams 1,16,32,64] [--runs 3] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from measure.method import (
    Prompts,
    attest_generate,
    decode_rate,
    describe_cpu,
    load_transformers,
    transformers_generate,
)

BEFORE, AFTER, HF = "attest torch-padded (before)", "attest torch (after)", "transformers"


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
        name: LLM(attention_backend=backend, kv_tokens=kv, max_running=most, speculative="off")
        for name, backend in ((BEFORE, "torch-padded"), (AFTER, "torch"))
    }
    vocab = engines[AFTER].core.model_config.vocab_size
    arms = {
        name: (attest_generate(llm), Prompts(vocab, i))
        for i, (name, llm) in enumerate(engines.items())
    }
    if not args.no_baseline:
        hf = load_transformers(engines[AFTER].core.loaded.path)
        arms[HF] = (transformers_generate(hf), Prompts(vocab, 9))

    load_before = os.getloadavg()[0]
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for n in streams:
        for go, prompts in arms.values():
            go(prompts.take(n, args.prompt_len), 4)  # warm-up at this batch size
        for _ in range(args.runs):
            for name, (go, prompts) in arms.items():
                rate = decode_rate(go, prompts, n, args.prompt_len, args.new_tokens)
                results.setdefault((name, n), []).append(rate)

    print(f"\ncpu: {describe_cpu()}")
    print(
        f"threads: {torch.get_num_threads()}, load average before/after: "
        f"{load_before:.2f}/{os.getloadavg()[0]:.2f}, runs: {args.runs}"
    )
    print(
        f"prompts: {args.prompt_len} random tokens, {args.new_tokens} new tokens, greedy; "
        "every Attest request asserted cached_tokens == 0"
    )
    print("decode tok/s (median; end-to-end output tok/s incl. prefill in brackets)")
    head = f"{'streams':>7} " + " ".join(f"{a:>30}" for a in arms)
    print(head + f" {'after/before':>13}" + (f" {'after/transformers':>19}" if HF in arms else ""))
    for n in streams:
        med = {
            a: (
                statistics.median(r[0] for r in results[a, n]),
                statistics.median(r[1] for r in results[a, n]),
            )
            for a in arms
        }
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
