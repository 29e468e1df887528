"""A behavioural fingerprint of the scheduler and memory code, for refactors that must change
nothing: the receipt kinds and counts of one pressured run, and greedy tokens.

Not a benchmark (nothing here is timed). The pressured run: 32 requests of varied lengths, a KV
pool the size of the three largest (prompt + max_tokens), chunks of 32, at most 8 running, check
mode (the invariants after every step), greedy. With ``--host-kv-tokens N`` the host tier joins
it. Run it before and after a change and compare the two outputs with ``diff``: a refactor that
keeps behaviour prints the same lines.

    .venv/bin/python bench/fingerprint.py [--model PATH] [--host-kv-tokens 0] > before.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random

from cpuinfo import describe  # bench/cpuinfo.py, beside this script


def pressured(model: str | None, host_kv_tokens: int) -> tuple[dict[str, int], str]:
    from engine import LLM, SamplingParams

    rng = random.Random(7)
    shapes = [(rng.randrange(8, 160), rng.randrange(8, 96)) for _ in range(32)]
    pool = sum(sorted(p + n for p, n in shapes)[-3:])
    llm = LLM(
        model=model,
        kv_tokens=pool,
        chunk_tokens=32,
        max_running=8,
        check_invariants=True,
        host_kv_tokens=host_kv_tokens,
    )
    vocab = llm.core.model_config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(p)] for p, _ in shapes]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for _, n in shapes]
    outs = llm.generate(prompts, params)
    counts = dict(sorted(llm.core.receipts.counts.items()))
    llm.close()
    tokens = json.dumps([o.token_ids for o in outs]).encode()
    return counts, hashlib.sha256(tokens).hexdigest()[:16]


def greedy(model: str | None) -> str:
    from engine import LLM, SamplingParams

    llm = LLM(model=model, check_invariants=True)
    prompts = ["What is the capital of France?", "Write a haiku about memory.", "2 + 2 ="]
    ids = [llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    outs = llm.generate(ids, SamplingParams(max_tokens=48, temperature=0))
    llm.close()
    return hashlib.sha256(json.dumps([o.token_ids for o in outs]).encode()).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file or HF folder (default model)")
    ap.add_argument("--host-kv-tokens", type=int, default=0)
    args = ap.parse_args()
    print(describe())  # greedy tokens may differ between CPUs: compare runs on one
    counts, digest = pressured(args.model, args.host_kv_tokens)
    print(f"pressured tokens {digest}")
    for kind, n in counts.items():
        print(f"  {kind} {n}")
    print(f"greedy tokens {greedy(args.model)}")


if __name__ == "__main__":
    main()
