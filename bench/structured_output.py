"""Constrained decoding's cost: a batch of 16 streams each held to a JSON schema by its grammar's
token mask, against the same batch unconstrained, in one run; and a request's time to its first
token with a schema the engine has never seen (the compile included), with that schema cached,
and unconstrained.

Decode rates are measure/method.py's (the prefill and first token timed apart and taken
out, fresh prompts, an empty prefix cache, every request asserted uncached). The schema is an
array of at least 200 objects: no output of --new-tokens tokens can complete it, so every
constrained stream runs exactly as many tokens as the unconstrained ones and its mask walks
the object's states (keys, a bounded string, a bounded integer, an enum). The compiled grammar is
cached after the warm-up: what is timed is the mask per step, never the compile. For the first
token, each "new schema" differs from every earlier one by its description, so its compile is a
miss (asserted from its `grammar.compile` receipt), then the same schema is asked again (a hit:
no compile receipt).

    .venv/bin/python bench/structured_output.py [--streams 16] [--runs 3] [--new-tokens 64]
        [--first-tokens 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import orjson

from engine.request.guide import json_schema_guide
from measure.method import Prompts, attest_generate, decode_rate, describe_cpu

ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tag": {"enum": ["alpha", "beta", "gamma"]},
    },
    "required": ["name", "age", "tag"],
    "additionalProperties": False,
}


def schema(description: str = "people") -> dict:
    return {"type": "array", "items": ITEM, "minItems": 200, "description": description}


def first_token_s(llm, prompts: Prompts, length: int, guide) -> float:
    from engine import SamplingParams

    llm.core.scheduler.cache.reset_to_empty()
    params = SamplingParams(max_tokens=1, temperature=0, guide=guide)
    t = time.perf_counter()
    llm.generate(prompts.take(1, length), params)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--first-tokens",
        type=int,
        default=8,
        help="first tokens timed per run for the cached schema and unconstrained",
    )
    ap.add_argument("--model", default=None, help="default: the default model")
    args = ap.parse_args()
    from engine import LLM

    n, length = args.streams, args.prompt_len
    llm = LLM(
        args.model,
        kv_tokens=n * (length + args.new_tokens + 8) + 64,
        max_running=n,
        speculative="off",
    )
    vocab, receipts = llm.core.model_config.vocab_size, llm.core.receipts
    guide = json_schema_guide(schema(), True, "schema")
    arms = {"unconstrained": attest_generate(llm), "json_schema": attest_generate(llm, guide)}
    prompts = Prompts(vocab, 0)
    load_before = os.getloadavg()[0]
    for go in arms.values():
        go(prompts.take(n, length), 4)  # warm-up; the grammar compiles here, once
    rates: dict[str, list[float]] = {a: [] for a in arms}
    ttft: dict[str, list[float]] = {"new schema": [], "cached schema": [], "unconstrained": []}
    compile_ms: list[float] = []
    for run in range(args.runs):
        for name, go in arms.items():
            rates[name].append(decode_rate(go, prompts, n, length, args.new_tokens)[0])
        fresh = json_schema_guide(schema(f"people, run {run}"), True, "schema")
        ttft["new schema"].append(first_token_s(llm, prompts, length, fresh))
        [compiled] = [r for r in receipts.of("grammar.compile") if r["guide"] == fresh.digest]
        assert compiled["cache"] == "miss" and compiled["outcome"] == "ok", compiled
        compile_ms.append(compiled["ms"])
        for k in range(args.first_tokens):  # pairs in alternating order: no arm always first
            for arm in (("cached schema", fresh), ("unconstrained", None))[:: 1 if k % 2 else -1]:
                ttft[arm[0]].append(first_token_s(llm, prompts, length, arm[1]))
        assert len([r for r in receipts.of("grammar.compile") if r["guide"] == fresh.digest]) == 1
    constrained = [r for r in receipts.of("request.finish") if r.get("constrained")]
    assert constrained and all(r["tokens"] in (1, 4, args.new_tokens + 1) for r in constrained)
    med = {a: statistics.median(v) for a, v in rates.items()}
    first = {a: statistics.median(v) for a, v in ttft.items()}
    print(f"\ncpu: {describe_cpu()}")
    print(
        f"load average before/after: {load_before:.2f}/{os.getloadavg()[0]:.2f}, runs: "
        f"{args.runs}; schema: {len(orjson.dumps(schema()))} bytes"
    )
    print(f"decode tok/s, {n} streams, {args.new_tokens} new tokens (median):")
    for a, v in med.items():
        print(f"  {a:>14}: {v:8.1f}   runs: {', '.join(f'{x:.1f}' for x in rates[a])}")
    print(f"  json_schema / unconstrained: {med['json_schema'] / med['unconstrained']:.3f}x")
    print(f"first token of one {length}-token prompt, s (median):")
    for a, v in first.items():
        print(f"  {a:>14}: {v:8.3f}")
    print(f"  compile of a new schema: {statistics.median(compile_ms):.1f} ms (median)")
    print(
        f"  cached schema / unconstrained: {first['cached schema'] / first['unconstrained']:.3f}x"
    )
    llm.close()


if __name__ == "__main__":
    main()
