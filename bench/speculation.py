"""Speculative decoding's speed on the default model: one stream on repetitive agent-like prompts
(a code edit, a summary that quotes its source, a tool call shaped like earlier ones, and a loop
of agent turns, each a fresh request for a tool call of the same shape) and on prompts with
nothing to copy, and 16 streams; each without drafts, with prompt lookup (--speculative ngram)
and with suffix lookup (--speculative suffix: the request's text and earlier requests'
outputs), in the same run; and, with --llamacpp-env, llama.cpp on the same GGUF and the same
token ids, without and with llama-cpp-python's prompt-lookup decoding
(``LlamaPromptLookupDecoding``, --llamacpp-draft tokens a step).

Each figure is a decode rate read from the request's own ``request.finish`` receipt: tokens
after the first over e2e - ttft, so the prefill is not in it (llama.cpp's: the same span, from
its first token out to its last). The prefix cache is emptied before every generate and every
receipt is asserted uncached (a cached prefill is not work); the suffix proposer's memory of
earlier outputs is emptied before every run too, so it never drafts a run's answer from the
run before (agent turns run one after another: each turn drafts from the turns before it in
that run). The arms alternate, and each figure is the median of --runs runs. Every arm's
greedy tokens are asserted equal to the plain arm's in exact mode (speculation must not change
an answer) and compared in fast mode. Requests stop where the model ends them or at
--new-tokens.

--cost times the price of drafting: the same stream with drafts that are always wrong (every
position verified and refused, pacing held off) against none, at batch sizes 1, 4, 8 and 16;
the cost of a drafted position as a share of a step is (t_drafted / t_plain - 1) / K. A
request's drafts pay while the share of them kept stays above it: engine/speculative/pace.py's
COST (and so MAX_BATCH) comes from this table.

    .venv/bin/python bench/speculation.py [--runs 3] [--new-tokens 128] [--spec-tokens 4]
        [--quant int8] [--arms ngram,suffix] [--llamacpp-env build/llamacpp-venv] [--cost]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
from pathlib import Path

from measure.method import describe_cpu

HERE = Path(__file__).parent / "prompts" / "speculation"
TURNS = {p.stem for p in HERE.glob("*.jsonl")}  # workloads run one request after another


def chat_ids(llm, text: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}], True)


def decode_rates(
    llm, prompts: list[list[int]], new: int, turns: bool = False
) -> tuple[list[float], list[list[int]]]:
    """One batched generate (``turns``: one request after another); each request's decode
    tok/s from its receipt, and its tokens."""
    from engine import SamplingParams

    if llm.core.scheduler.spec is not None and llm.core.config.scheduler.speculative == "suffix":
        from engine.speculative.propose import SuffixLookup

        llm.core.scheduler.spec.proposer = SuffixLookup()  # nothing remembered from a run before
    params = SamplingParams(max_tokens=new, temperature=0)
    outs = []
    for batch in [[p] for p in prompts] if turns else [prompts]:
        llm.core.scheduler.cache.reset_to_empty()  # each turn's prefill is its own
        outs += llm.generate(batch, params)
    fins = {f["rid"]: f for f in llm.core.receipts.of("request.finish")[-len(prompts) :]}
    assert len(fins) == len(prompts) and all(f["cached"] == 0 for f in fins.values())
    rates = [(f["tokens"] - 1) / (f["e2e_s"] - f["ttft_s"]) for f in fins.values()]
    return rates, [o.token_ids for o in outs]


def compare(
    engines: dict, prompts: list[list[int]], new: int, runs: int, exact: bool, turns: bool
) -> tuple[dict[str, float], dict[str, float]]:
    """Median decode tok/s of each arm (per stream, averaged over the streams of a run), and
    the share of each arm's tokens before its first difference from the first arm's (exact
    mode asserts 1.0)."""
    got: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[list[int]]] = {}
    for _ in range(runs):
        for name, llm in engines.items():
            rates, tokens[name] = decode_rates(llm, prompts, new, turns)
            got[name].append(statistics.fmean(rates))
    first = next(iter(tokens.values()))
    same = {name: agreement(first, t) for name, t in tokens.items()}
    assert all(v == 1.0 for v in same.values()) or not exact, f"an answer changed: {same}"
    return {name: statistics.median(v) for name, v in got.items()}, same


def agreement(first: list[list[int]], second: list[list[int]]) -> float:
    return sum(common_prefix(a, b) for a, b in zip(first, second)) / sum(map(len, first))


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def workloads(llm) -> dict[str, list[list[int]]]:
    """The repetitive prompts (bench/prompts/speculation: a .txt is one prompt, a .jsonl a
    loop of turns), a story (nothing in the prompt to copy) and random tokens (nothing to copy,
    and no text)."""
    texts = {p.stem: [p.read_text()] for p in sorted(HERE.glob("*.txt"))}
    for p in sorted(HERE.glob("*.jsonl")):
        texts[p.stem] = [json.loads(line) for line in p.read_text().splitlines()]
    texts["story"] = [
        "Write a short story about a lighthouse keeper who finds a message in a bottle."
    ]
    out = {name: [chat_ids(llm, t) for t in ts] for name, ts in texts.items()}
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
    from engine.scheduler import speculate
    from engine.speculative import pace

    pace.COST, speculate.MAX_BATCH = ((1 << 20, -1.0),), 1 << 20  # every draft, every batch
    plain = LLM(model, speculative="off", **kw)
    drafted = LLM(model, speculative="ngram", spec_tokens=args.spec_tokens, **kw)
    drafted.core.scheduler.spec.proposer = Wrong(drafted.core.model_config.vocab_size)
    base = workloads(plain)["story"][0]
    print(
        f"\ncost of {args.spec_tokens} refused drafts per step (decode tok/s, median of "
        f"{args.runs}; share of a step per drafted position):"
    )
    for batch in (1, 4, 8, 16):
        prompts = [[1000 + i, *base] for i in range(batch)]
        arms = {"plain": plain, "drafted": drafted}
        rates, _ = compare(arms, prompts, 48, args.runs, exact=False, turns=False)
        share = (rates["plain"] / rates["drafted"] - 1) / args.spec_tokens
        print(
            f"  batch {batch:>2}: plain {rates['plain']:7.2f}  drafted {rates['drafted']:7.2f}"
            f"  per-position cost {share:.3f}"
        )


def llamacpp_rows(args, loads: dict[str, list[list[int]]]) -> dict[str, tuple[float, float]]:
    """llama.cpp's decode tok/s per one-stream workload, without drafts and with its prompt
    lookup (median of --runs, alternating); its tokens with drafts compared with its own
    without."""
    from engine.model.loader import resolve_model_path
    from measure.llamacpp import LlamaCppWorker

    out = {}
    with LlamaCppWorker(args.llamacpp_env, resolve_model_path(args.model), os.cpu_count()) as w:
        print(f"llama.cpp: llama-cpp-python {w.info['version']}; {w.info['system']}")
        for draft in (0, args.llamacpp_draft):  # warm-up: each Llama made and run once
            w.lookup(next(iter(loads.values()))[0], 8, draft)
        for name, prompts in loads.items():
            got: dict[int, list[float]] = {0: [], args.llamacpp_draft: []}
            tokens: dict[int, list[list[int]]] = {}
            for _ in range(args.runs):
                for draft in got:
                    runs = [w.lookup(p, args.new_tokens, draft) for p in prompts]
                    got[draft].append(statistics.fmean((len(t) - 1) / s for s, t in runs))
                    tokens[draft] = [t for _, t in runs]
            same = agreement(tokens[0], tokens[args.llamacpp_draft])
            plain, drafted = (statistics.median(v) for v in got.values())
            print(
                f"  {name:<14} llama.cpp {plain:7.2f}  prompt lookup {drafted:7.2f}  "
                f"x{drafted / plain:.3f}  (same tokens {same:.0%})"
            )
            out[name] = plain, drafted
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--spec-tokens", type=int, default=4)
    ap.add_argument("--quant", default=None, choices=[None, "int8", "int4"])
    ap.add_argument("--arms", default="ngram,suffix", help="proposers to run beside plain")
    ap.add_argument("--cost", action="store_true", help="the per-position cost table only")
    ap.add_argument("--only", nargs="*", default=None, help="these workloads only")
    ap.add_argument("--model", default=None, help="default: the default model")
    ap.add_argument("--llamacpp-env", default=None, help="llama.cpp's virtualenv: its arm")
    ap.add_argument("--llamacpp-draft", type=int, default=10, help="its num_pred_tokens")
    args = ap.parse_args()
    from engine import LLM

    print(describe_cpu())
    print(f"load before: {os.getloadavg()[0]:.2f}; quant {args.quant or 'off (exact mode)'}")
    kw = dict(kv_tokens=16 * 1024, max_running=16, quant=args.quant)
    if args.cost:
        cost_table(args.model, args, kw)
        return
    engines = {"plain": LLM(args.model, speculative="off", **kw)}
    for arm in args.arms.split(","):
        engines[arm] = LLM(args.model, speculative=arm, spec_tokens=args.spec_tokens, **kw)
    loads = workloads(engines["plain"])
    loads = {k: v for k, v in loads.items() if args.only is None or k in args.only}
    for prompts in loads.values():
        decode_rates(engines["plain"], prompts, 8)  # warm-up
    theirs = llamacpp_rows(args, loads) if args.llamacpp_env else {}
    print(
        f"\ndecode tok/s, one stream unless said, median of {args.runs} (ratio to plain; "
        "drafts kept / verified; share of tokens before a first difference from plain):"
    )
    rows = [(name, prompts, name in TURNS) for name, prompts in loads.items()]
    rows.append(("16 streams", ([p for ps in loads.values() for p in ps] * 4)[:16], False))
    for name, prompts, turns in rows:
        before = {a: e.core.scheduler.snapshot().spec for a, e in engines.items() if a != "plain"}
        r, same = compare(engines, prompts, args.new_tokens, args.runs, not args.quant, turns)
        line = f"  {name:<14} plain {r['plain']:7.2f}"
        for arm, b in before.items():
            a = engines[arm].core.scheduler.snapshot().spec
            line += (
                f"  {arm} {r[arm]:7.2f} x{r[arm] / r['plain']:.3f} "
                f"({a.accepted_tokens - b.accepted_tokens}/{a.draft_tokens - b.draft_tokens}"
                f"; {same[arm]:.0%})"
            )
        if name in theirs:
            best = max(r[a] for a in before)
            line += f"  | best / llama.cpp prompt lookup x{best / theirs[name][1]:.3f}"
        print(line)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
