"""Fast mode's greedy agreement with exact mode on held-out chat prompts
(``measure.agreement``: teacher-forced share of positions where the next token is the same, and
the common prefix of the free-running outputs).

    .venv/bin/python bench/quant_agreement.py [--modes int8,int4] [--tokens 32]
"""

from __future__ import annotations

import argparse

from cpuinfo import describe  # bench/cpuinfo.py, beside this script

from engine import LLM
from measure.agreement import PROMPTS, greedy_agreement


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="int8,int4")
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    exact = LLM(kv_tokens=16384, receipts=False)
    prompts = [exact.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    print(f"cpu: {describe()}")
    print(f"{len(prompts)} held-out prompts x {args.tokens} tokens, baseline: exact mode (float32)")
    for mode in args.modes.split(","):
        fast = LLM(kv_tokens=16384, receipts=False, quant=mode)
        a = greedy_agreement(exact, fast, prompts, args.tokens)
        print(
            f"{mode}: {a.equal}/{a.positions} positions agree = {a.share:.1%}; "
            f"common prefixes {a.common_prefix}"
        )
        fast.close()


if __name__ == "__main__":
    main()
