"""Multi-turn chats sharing a long system prompt, more chats than the device pool holds: the
host KV tier vs none, in the same process.

Each turn sends every chat's whole history (the system prompt, earlier questions and answers)
plus a new question, all chats at once, greedy. Without the tier the pool cannot keep the
chats' histories, so later turns recompute them; with it, cold prefixes spill to host memory
and load back on the next turn's hit. Reported per arm (median of --runs, the arms alternating,
every run from a cold cache): the prefix hit rate (prompt tokens served from the cache, all
turns and after the first), output tokens/s over the whole run, and with the tier the spill and
load bandwidth (bytes moved / seconds spent moving them). Greedy answers must be identical in
both arms; the script checks it.

    .venv/bin/python bench/host_tier.py [--runs 3] [--chats 12] [--turns 4] [--system 384]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from cpuinfo import describe  # bench/cpuinfo.py, beside this script


def run_chats(llm, args, vocab: int) -> dict[str, float]:
    """One cold run of the whole conversation; its numbers."""
    from engine import SamplingParams

    llm.core.scheduler.cache.reset_to_empty()
    tier = llm.core.host_tier
    moved0 = dict(tier.moved) if tier else {}
    receipts = llm.core.receipts
    first = receipts.counts["request.finish"]
    rng = random.Random(args.seed)
    system = [rng.randrange(2, vocab) for _ in range(args.system)]
    history = [
        system + [rng.randrange(2, vocab) for _ in range(args.user)] for _ in range(args.chats)
    ]
    params = SamplingParams(max_tokens=args.output, temperature=0, ignore_eos=True)
    answers, out_tokens = [], 0
    t0 = time.perf_counter()
    for _ in range(args.turns):
        outs = llm.generate(history, params)
        answers += [o.token_ids for o in outs]
        out_tokens += sum(len(o.token_ids) for o in outs)
        history = [
            h + o.token_ids + [rng.randrange(2, vocab) for _ in range(args.user)]
            for h, o in zip(history, outs)
        ]
    wall = time.perf_counter() - t0
    ends = [r for r in receipts.of("request.finish")][
        -(receipts.counts["request.finish"] - first) :
    ]
    later = ends[args.chats :]

    def rate(rs) -> float:
        return sum(r["cached"] for r in rs) / max(1, sum(r["prompt_tokens"] for r in rs))

    out = {
        "hit": rate(ends),
        "hit_later": rate(later),
        "tok_s": out_tokens / wall,
        "wall": wall,
        "computed": sum(r["prompt_tokens"] - r["cached"] for r in ends),
        "answers": answers,
    }
    if tier:
        moved = {k: tier.moved[k] - moved0[k] for k in tier.moved}
        bpt = tier.bytes_per_token
        out["spill_gb"] = moved["spill_tokens"] * bpt / 1e9
        out["load_gb"] = moved["load_tokens"] * bpt / 1e9
        out["spill_gbs"] = out["spill_gb"] / max(moved["spill_s"], 1e-9)
        out["load_gbs"] = out["load_gb"] / max(moved["load_s"], 1e-9)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--chats", type=int, default=12)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system", type=int, default=384, help="shared system prompt tokens")
    ap.add_argument("--user", type=int, default=24, help="new tokens per question")
    ap.add_argument("--output", type=int, default=16, help="tokens per answer")
    ap.add_argument("--kv-tokens", type=int, default=1536, help="device pool (tokens)")
    ap.add_argument("--host-kv-tokens", type=int, default=16384, help="host tier (tokens)")
    ap.add_argument("--model", default=None, help="default: the default model")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()

    from engine import LLM

    common = dict(
        model=args.model,
        dtype=args.dtype,
        kv_tokens=args.kv_tokens,
        threads=args.threads,
        speculative="off",
    )
    arms = {
        "no tier": LLM(**common, host_kv_tokens=0),
        "host tier": LLM(**common, host_kv_tokens=args.host_kv_tokens),
    }
    vocab = arms["no tier"].core.model_config.vocab_size
    chat = args.system + args.turns * (args.user + args.output)
    print(f"CPU: {describe()}")
    print(
        f"{args.chats} chats x {args.turns} turns, system prompt {args.system} tokens, "
        f"{args.user} new tokens per question, {args.output} per answer (a chat reaches "
        f"{chat} tokens); device pool {args.kv_tokens} tokens, host tier "
        f"{args.host_kv_tokens}; {args.dtype}, median of {args.runs} runs"
    )
    results: dict[str, list[dict]] = {name: [] for name in arms}
    for i in range(args.runs):
        for name, llm in arms.items():
            r = run_chats(llm, args, vocab)
            results[name].append(r)
            print(
                f"  run {i + 1} {name:9s}: {r['tok_s']:7.2f} out tok/s, hit {r['hit']:.3f}, {r['wall']:.1f} s"
            )
    a, b = results["no tier"], results["host tier"]
    assert all(x["answers"] == a[0]["answers"] for x in a + b), "greedy answers differ"

    def med(rs, k):
        return statistics.median(r[k] for r in rs)

    print()
    print("| arm | prefix hit rate | hit rate after turn 1 | prompt tokens computed | out tok/s |")
    print("|---|---|---|---|---|")
    for name, rs in results.items():
        print(
            f"| {name} | {med(rs, 'hit'):.3f} | {med(rs, 'hit_later'):.3f} | "
            f"{med(rs, 'computed'):,.0f} | {med(rs, 'tok_s'):.2f} |"
        )
    print(f"\nout tok/s, host tier / no tier: {med(b, 'tok_s') / med(a, 'tok_s'):.2f}x")
    print(
        f"spill: {med(b, 'spill_gb'):.3f} GB at {med(b, 'spill_gbs'):.2f} GB/s; "
        f"load: {med(b, 'load_gb'):.3f} GB at {med(b, 'load_gbs'):.2f} GB/s (medians)"
    )
    print("greedy answers identical in every run of both arms")


if __name__ == "__main__":
    main()
