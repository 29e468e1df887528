"""What the ``iteration`` receipt's cadence costs in the log: receipts, bytes and iteration
receipts of three workloads on the tests' tiny model (greedy, seeded: the counts are the same on
every run and machine), then the time of the per-step decision and of one iteration receipt
written to a boot log (the minimum of five repeats).

Workloads: 32 requests at once under a pool that holds about three (chunks of 32, at most 8
running); the offline bench's shape (32 prompts of 128 tokens, 64 new each, a roomy pool);
a stream (64 requests, one arriving every third step, at most 8 running).

    .venv/bin/python bench/iteration_receipts.py

Run it in two checkouts (before and after a change to the cadence) to compare.
"""

from __future__ import annotations

import random
import sys
import tempfile
import timeit
from collections import Counter
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.tiny_model, the workloads


def _tally(log: Path) -> tuple[int, int, int, int]:
    lines = log.read_bytes().splitlines()
    kinds = Counter(orjson.loads(line)["event"] for line in lines)
    its = sum(len(line) + 1 for line in lines if b'"event":"iteration"' in line)
    return len(lines), log.stat().st_size, kinds["iteration"], its


def _stream(llm, prompts, params, every: int = 3) -> int:
    sched, i, steps = llm.core.scheduler, 0, 0
    while i < len(prompts) or sched.has_work():
        if i < len(prompts) and steps % every == 0:
            sched.add_request(prompts[i], params[i])
            i += 1
        sched.step()
        steps += 1
    return steps


def main() -> None:
    from engine import LLM, SamplingParams
    from tests.integration.test_pressure import three_at_once, workload
    from tests.tiny_model import make_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="iteration-receipts-"))
    model = str(make_tiny_model(tmp / "tiny"))
    rows = []

    prompts, params = workload(300, n=32)
    log = tmp / "pressured.jsonl"
    kv = three_at_once(prompts, params)
    llm = LLM(
        model=model,
        kv_tokens=kv,
        chunk_tokens=32,
        max_running=8,
        speculative="off",
        log_file=str(log),
    )
    llm.generate(prompts, params)
    llm.close("test")
    rows.append(("32 at once, tight pool", *_tally(log)))

    rng = random.Random(0)
    batch = [[rng.randrange(2, 300) for _ in range(128)] for _ in range(32)]
    same = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    log = tmp / "offline.jsonl"
    llm = LLM(model=model, kv_tokens=16384, speculative="off", log_file=str(log))
    llm.generate(batch, [same] * len(batch))
    llm.close("test")
    rows.append(("offline bench shape", *_tally(log)))

    prompts, params = workload(300, n=64, seed=4)
    log = tmp / "stream.jsonl"
    llm = LLM(model=model, kv_tokens=16384, max_running=8, speculative="off", log_file=str(log))
    steps = _stream(llm, prompts, params)
    llm.close("test")
    rows.append((f"stream, 1 per 3 steps ({steps} steps)", *_tally(log)))

    print("| workload | receipts | bytes | iteration receipts | their bytes |")
    print("|---|---|---|---|---|")
    for name, n, size, its, its_bytes in rows:
        print(f"| {name} | {n} | {size} | {its} | {its_bytes} |")

    llm = LLM(
        model=model,
        kv_tokens=16384,
        max_running=8,
        speculative="off",
        log_file=str(tmp / "cost.jsonl"),
    )
    sched = llm.core.scheduler
    for p, q in zip(prompts[:8], params[:8]):
        sched.add_request(p, q)
    sched.step()
    due = getattr(sched, "_iteration_due", None)
    if due is not None:
        per = min(timeit.repeat(due, number=20_000, repeat=5)) / 20_000
        print(f"the decision, 8 running: {per * 1e6:.2f} us a step")
    per = min(timeit.repeat(sched._iteration_receipt, number=2_000, repeat=5)) / 2_000
    print(f"one iteration receipt to a boot log: {per * 1e6:.1f} us")
    llm.close("test")


if __name__ == "__main__":
    main()
