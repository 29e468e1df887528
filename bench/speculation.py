"""Speculative decoding's speed on the default model: one stream on repetitive agent-like prompts
(a code edit, a summary that quotes its source, a tool call shaped like earlier ones) and on
prompts with nothing to copy, and 16 streams, each with drafts (prompt lookup, --speculative
ngram) against without, in the same run; and what a drafted position costs.

Each figure is a decode rate read from the request's own ``request.finish`` receipt: tokens
after the first over e2e - ttft, so the prefill is not in it. The prefix cache is emptied before
every generate and every receipt is asserted uncached (a cached prefill is not work); the two
arms alternate, and each figure is the median of --runs runs. The greedy tokens of both arms
are asserted equal (speculation must not change an answer). Requests stop where the model ends
them or at --new-tokens.

--cost times the price of drafting: the same stream with drafts that are always wrong (every
position verified and refused, pacing held off) against none, at batch sizes 1, 4, 8 and 16;
the cost of a drafted position as a share of a step is (t_drafted / t_plain - 1) / K. A
request's drafts pay while the share of them kept stays above it: engine/spec/pace.py's
COST (and so MAX_BATCH) comes from this table.

    .venv/bin/python bench/speculation.py [--runs 3] [--new-tokens 128] [--spec-tokens 4]
        [--quant int8] [--cost]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
from pathlib import Path

from engine.benchmark.method import describe_cpu

HERE = Path(__file__).parent / "prompts" / "speculation"


def chat_ids(llm, text: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}], True)


def decode_rates(llm, prompts: list[list[int]], new: int) -> tuple[list[float], list[list[int]]]:
    """One batched generate; each request's decode tok/s from its receipt, and its tokens."""
    from engine import SamplingParams

    llm.core.scheduler.cache.reset_to_empty()
    outs = llm.generate(prompts, SamplingParams(max_tokens=new, temperature=0))
    fins = {f["rid"]: f for f in llm.core.receipts.of("request.finish")[-len(prompts) :]}
    assert len(fins) == len(prompts) and all(f["cached"] == 0 for f in fins.values())
    rates = [(f["tokens"] - 1) / (f["e2e_s"] - f["ttft_s"]) for f in fins.values()]
    return rates, [o.token_ids for o in outs]


def compare(
    engines: dict, prompts: list[list[int]], new: int, runs: int, exact: bool = True
) -> tuple[dict[str, float], float]:
    """Median decode tok/s of each arm (per stream, averaged over the streams of a run), and
    the share of the second arm's tokens before its first difference from the first's (exact
    mode asserts 1.0; fast mode's kernels round a wider forward differently)."""
    got: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[list[int]]] = {}
    for _ in range(runs):
        for name, llm in engines.items():
            rates, tokens[name] = decode_rates(llm, prompts, new)
            got[name].append(statistics.fmean(rates))
    first, second = tokens.values()
    same = sum(common_prefix(a, b) for a, b in zip(first, second)) / sum(map(len, first))
    assert same == 1.0 or not exact, "speculation changed a greedy answer in exact mode"
    return {name: statistics.median(v) for name, v in got.items()}, same


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def workloads(llm) -> dict[str, list[list[int]]]:
    """The repetitive prompts (bench/prompts/speculation), a story (nothing in the prompt to
    copy) and random tokens (nothing to copy, and no text)."""
    texts = {p.stem: p.read_text() for p in sorted(HERE.glob("*.txt"))}
    texts["story"] = (
        "Write a short story about a lighthouse keeper who finds a message in a bottle."
    )
    out = {name: [chat_ids(llm, t)] for name, t in texts.items()}
    vocab = llm.core.model_config.vocab_size
    out["random"] = [random.Random(0).sample(range(1000, vocab), 200)]
    return out


class Wrong:
    """Proposes K tokens no greedy answer takes (ids past the model's text): each refused."""

    def __init__(self, vocab: int) -> None:
        self.token = vocab - 1

    def propose(self, req, k: int) -> list[int]:
        return [self.token] * k

    def finished(self, req) -> None:
        pass


def cost_table(model, args, kw) -> None:
    from engine import LLM
    from engine.sched import speculate
    from engine.spec import pace

    pace.COST, speculate.MAX_BATCH = ((1 << 20, -1.0),), 1 << 20  # every draft, every batch
    plain = LLM(model, **kw)
    drafted = LLM(model, speculative="ngram", spec_tokens=args.spec_tokens, **kw)
    drafted.core.scheduler.spec.proposer = Wrong(drafted.core.model_config.vocab_size)
    base = workloads(plain)["story"][0]
    print(f"\ncost of {args.spec_tokens} refused drafts per step (decode tok/s, median of "
          f"{args.runs}; share of a step per drafted position):")  # fmt: skip
    for batch in (1, 4, 8, 16):
        prompts = [[1000 + i, *base] for i in range(batch)]
        rates, _ = compare({"plain": plain, "drafted": drafted}, prompts, 48, args.runs, False)
        share = (rates["plain"] / rates["drafted"] - 1) / args.spec_tokens
        print(f"  batch {batch:>2}: plain {rates['plain']:7.2f}  drafted {rates['drafted']:7.2f}"
              f"  per-position cost {share:.3f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--spec-tokens", type=int, default=4)
    ap.add_argument("--quant", default=None, choices=[None, "int8", "int4"])
    ap.add_argument("--cost", action="store_true", help="the per-position cost table only")
    ap.add_argument("--only", nargs="*", default=None, help="these workloads only")
    ap.add_argument("--model", default=None, help="default: the default model")
    args = ap.parse_args()
    from engine import LLM

    print(describe_cpu())
    print(f"load before: {os.getloadavg()[0]:.2f}; quant {args.quant or 'off (exact mode)'}")
    kw = dict(kv_tokens=16 * 1024, max_running=16, quant=args.quant)
    if args.cost:
        cost_table(args.model, args, kw)
        return
    plain = LLM(args.model, **kw)
    spec = LLM(args.model, speculative="ngram", spec_tokens=args.spec_tokens, **kw)
    engines = {"plain": plain, "ngram": spec}
    loads = {k: v for k, v in workloads(plain).items() if args.only is None or k in args.only}
    for prompts in loads.values():
        decode_rates(plain, prompts, 8)  # warm-up
    print(f"\ndecode tok/s, one stream unless said, median of {args.runs} (ratio ngram/plain):")
    rows = [(name, prompts) for name, prompts in loads.items()]
    rows.append(("16 streams", [p for ps in loads.values() for p in ps] * 4))
    for name, prompts in rows:
        before = spec.core.scheduler.snapshot().spec
        r, same = compare(engines, prompts[:16], args.new_tokens, args.runs, not args.quant)
        after = spec.core.scheduler.snapshot().spec
        kept = after.accepted_tokens - before.accepted_tokens
        shown = after.draft_tokens - before.draft_tokens
        print(f"  {name:<14} plain {r['plain']:7.2f}  ngram {r['ngram']:7.2f}  "
              f"x{r['ngram'] / r['plain']:.3f}  (drafts kept {kept}/{shown}; same tokens "
              f"{same:.0%})")  # fmt: skip
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
