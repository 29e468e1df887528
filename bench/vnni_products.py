"""Fast mode with and without its integer products (``engine.model.vnni``: FBGEMM's VNNI product
for the LM head), in one run: decode tok/s per stream count, the two arms alternating on fresh
prompts (the prefix cache emptied, every request asserted uncached), and with --agreement each
arm's greedy agreement with exact mode on the held-out prompts (``engine.agreement``).

The baseline arm is the same mode loaded with ``ATTEST_VNNI=0`` (torch's packed int8 kernel for
the head, as before the integer products); the run asserts from each arm's plan which one it is.

    .venv/bin/python bench/vnni_products.py [--modes int8,int4] [--streams 1,16,64] [--runs 5]
        [--prompt-len 128] [--new-tokens 64] [--agreement]
"""

from __future__ import annotations

import argparse
import os
import statistics

from cpuinfo import describe  # bench/cpuinfo.py, beside this script

from engine import LLM
from engine.agreement import PROMPTS, greedy_agreement
from engine.benchmark.method import Prompts, attest_generate, decode_rate


def load(mode: str, vnni: bool) -> LLM:
    """``mode`` with the integer products on or off (read when the plan is made, at load)."""
    old = os.environ.pop("ATTEST_VNNI", None)
    if not vnni:
        os.environ["ATTEST_VNNI"] = "0"
    try:
        llm = LLM(quant=mode, speculative="off", kv_tokens=32768, receipts=True)
    finally:
        os.environ.pop("ATTEST_VNNI", None)
        if old is not None:
            os.environ["ATTEST_VNNI"] = old
    rows = llm.core.model.quant.vnni_rows
    assert (rows > 0) == vnni, f"{mode}: the arm asked vnni={vnni}, its plan has {rows} rows"
    return llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="int8,int4")
    ap.add_argument("--streams", default="1,16,64")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--agreement", action="store_true")
    args = ap.parse_args()
    print(f"cpu: {describe()}; load average {os.getloadavg()[0]:.2f}")
    print(f"{args.prompt_len}-token prompts, {args.new_tokens} new tokens, greedy; decode tok/s, "
          f"median of {args.runs} alternating runs; baseline: ATTEST_VNNI=0")  # fmt: skip
    exact = LLM(kv_tokens=16384, receipts=False) if args.agreement else None
    for mode in args.modes.split(","):
        arms = {"vnni": load(mode, True), "packed": load(mode, False)}
        print(f"{mode}: {arms['vnni'].core.model.quant.path}")
        vocab = arms["vnni"].core.model.cfg.vocab_size
        prompts = Prompts(vocab, seed=0)
        goes = {name: attest_generate(llm) for name, llm in arms.items()}
        for n in (int(s) for s in args.streams.split(",")):
            got: dict[str, list[float]] = {name: [] for name in arms}
            for go in goes.values():
                go(prompts.take(n, args.prompt_len), 4)  # warm-up at this batch size
            for r in range(args.runs):
                order = list(goes) if r % 2 == 0 else list(reversed(goes))
                for name in order:
                    rate = decode_rate(goes[name], prompts, n, args.prompt_len, args.new_tokens)
                    got[name].append(rate[0])
            med = {name: statistics.median(v) for name, v in got.items()}
            print(f"  {mode} {n:>3} streams: vnni {med['vnni']:.1f} ({min(got['vnni']):.1f}-"
                  f"{max(got['vnni']):.1f}), packed {med['packed']:.1f} ({min(got['packed']):.1f}-"
                  f"{max(got['packed']):.1f}) tok/s, ratio {med['vnni'] / med['packed']:.2f}x")  # fmt: skip
        if exact is not None:
            ids = [exact.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
            for name, llm in arms.items():
                a = greedy_agreement(exact, llm, ids, 32)
                print(f"  {mode} {name}: {a.equal}/{a.positions} positions agree with exact = "
                      f"{a.share:.1%}; common prefixes {a.common_prefix}")  # fmt: skip
        for llm in arms.values():
            llm.close()


if __name__ == "__main__":
    main()
