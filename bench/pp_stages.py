"""Pipeline stages on this machine: what a stage crossing costs, and prefill and decode
throughput at pp 1 (the baseline, same run) and at each --pp, in exact mode (float32), greedy,
speculation off.

Three loads per arm, each median of --runs, the same prompts in every arm (random token ids,
fresh each run, the prefix cache off: every request's `request.finish` is asserted to show
cached == 0, so no run times a cache hit):

* one stream decoding --new-tokens tokens: its time per token (a step of one micro-batch, which
  crosses every stage boundary once and broadcasts the logits); its difference to pp 1, per
  boundary. That difference is not the transfer alone: spawned ranks share the machine's
  cores (each rank gets cores / ranks threads), so a stage computes its layers on fewer;
* --streams streams decoding (micro-batches as many as stages): output tokens/s;
* --streams prompts of --prefill tokens, one new token each: prompt tokens/s.

And the transfer alone, between two processes over gloo on loopback as the stages use it:
a micro-batch's two activations ([rows, hidden] float32 each) sent one way (half a round trip)
and the logits ([rows, vocab] float32) broadcast, at 1 and --streams rows, median of 200.

Greedy tokens must be identical to pp 1's in every load (asserted). On a machine with fewer
cores than ranks x threads the stages share cores: the point of pp here is correctness and the
cost of a crossing; overlap needs cores (or devices) for each stage.

    .venv/bin/python bench/pp_stages.py [--model PATH] [--pp 2,3] [--streams 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from cpuinfo import describe  # bench/cpuinfo.py, beside this script


def timed(llm, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    s = time.perf_counter() - t
    assert all(len(o.token_ids) == new for o in outs)
    fins = llm.core.receipts.of("request.finish")[-len(prompts) :]
    assert all(f["cached"] == 0 for f in fins), "a prefix-cache hit"
    return s, [o.token_ids for o in outs]


def _transfer(rank: int, port: int, hidden: int, vocab: int, rows: list[int], out) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    result = {}
    for n in rows:
        acts = [torch.randn(n, hidden), torch.randn(n, hidden)]
        logits = torch.randn(n, vocab)
        trips, casts = [], []
        for _ in range(220):
            t = time.perf_counter()
            if rank == 0:
                for a in acts:
                    dist.send(a, 1)
                for a in acts:
                    dist.recv(a, 1)
            else:
                for a in acts:
                    dist.recv(a, 0)
                for a in acts:
                    dist.send(a, 0)
            trips.append(time.perf_counter() - t)
            t = time.perf_counter()
            dist.broadcast(logits, 1)
            casts.append(time.perf_counter() - t)
        result[n] = (statistics.median(trips[20:]) / 2, statistics.median(casts[20:]))
    if rank == 0:
        out.put(result)
    dist.destroy_process_group()


def transfer_costs(hidden: int, vocab: int, rows: list[int]) -> dict[int, tuple[float, float]]:
    """(one-way seconds of a micro-batch's activations, seconds of a logits broadcast) by rows."""
    import torch.multiprocessing as mp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from engine.group.spawn import free_port

    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [
        ctx.Process(target=_transfer, args=(r, port, hidden, vocab, rows, out)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join()
    return result


def arm(model: str | None, pp: int, loads: list[dict], args: argparse.Namespace) -> dict:
    from engine import LLM, SamplingParams

    kv = args.streams * (args.prefill + args.new_tokens) + 256
    llm = LLM(
        model, pp=pp, kv_tokens=kv, speculative="off", prefix_cache=False, group_check_interval=16
    )
    llm.generate([[5, 6, 7, 8]] * 2, SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    out = {"pp": pp}
    for load in loads:
        runs = [timed(llm, p, load["new"]) for p in load["prompts"]]
        out[load["name"]] = statistics.median(s for s, _ in runs)
        out[load["name"] + "_tokens"] = [t for _, t in runs]
    llm.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file or HF folder (default model)")
    ap.add_argument("--pp", default="2,3", help="stage counts to measure beside pp 1")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32, help="the decode loads' prompts")
    ap.add_argument("--prefill", type=int, default=256, help="the prefill load's prompts")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(describe())
    from engine.model.loader import load_model

    cfg = load_model(args.model or None).config
    vocab = cfg.vocab_size
    rng = random.Random(0)

    def fresh(n: int, length: int) -> list[list[int]]:
        return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]

    s, p, n, r = args.streams, args.prompt_len, args.new_tokens, args.runs
    loads = [
        {"name": "one", "new": n, "prompts": [fresh(1, p) for _ in range(r)]},
        {"name": "many", "new": n, "prompts": [fresh(s, p) for _ in range(r)]},
        {"name": "prefill", "new": 1, "prompts": [fresh(s, args.prefill) for _ in range(r)]},
    ]
    stages = [1] + [int(x) for x in args.pp.split(",")]
    rows = [arm(args.model, pp, loads, args) for pp in stages]
    for row in rows[1:]:
        for load in loads:
            name = load["name"] + "_tokens"
            assert row[name] == rows[0][name], f"pp {row['pp']}: other tokens than pp 1"
    print(
        f"float32, speculation off, median of {r}; one stream: {p} prompt + {n} new tokens; "
        f"{s} streams: the same; prefill: {s} x {args.prefill} tokens, 1 new"
    )
    print(
        f"{'pp':>3} {'1 stream ms/tok':>16} {'+ms/boundary':>13} {'out tok/s':>10} "
        f"{'ratio':>6} {'prefill tok/s':>14} {'ratio':>6}"
    )
    base = rows[0]
    for row in rows:
        per_tok = 1e3 * row["one"] / n
        cross = (per_tok - 1e3 * base["one"] / n) / (row["pp"] - 1) if row["pp"] > 1 else 0.0
        out_s, pre_s = s * n / row["many"], s * args.prefill / row["prefill"]
        print(
            f"{row['pp']:>3} {per_tok:>16.2f} {cross:>13.2f} {out_s:>10.1f} "
            f"{out_s / (s * n / base['many']):>6.2f} {pre_s:>14.1f} "
            f"{pre_s / (s * args.prefill / base['prefill']):>6.2f}"
        )
    print("tokens: identical to pp 1 in every load (asserted)")
    costs = transfer_costs(cfg.hidden_size, vocab, [1, s])
    print(f"transfer alone (gloo, loopback, float32; hidden {cfg.hidden_size}, vocab {vocab}):")
    for n, (one_way, cast) in costs.items():
        print(
            f"  {n:>3} rows: activations one way {1e6 * one_way:8.0f} us, "
            f"logits broadcast {1e6 * cast:8.0f} us"
        )


if __name__ == "__main__":
    main()
