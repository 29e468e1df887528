"""The host's share of a decode step: scheduler steps per second at 1 and 64 streams on a tiny
random model, where the forward's arithmetic is negligible, so what is timed is the host's work
per step (the scheduler's loop, the batch's tensors built, Python per layer, the sampler).

Each stream's prompt is prefilled first; a step then gives every stream one token (speculation
off), so decode steps per second = extra tokens per stream / the extra seconds they took
(``generate`` with 1 new token and with 1 + ``--steps``, medians of ``--reps``).

    .venv/bin/python bench/host_step.py [--streams 1,64] [--steps 64] [--reps 3]
    .venv/bin/python bench/host_step.py --trees OTHER_TREE,.   # before/after in one sitting

With ``--trees`` each tree's engine runs in a child process of its own, the trees alternating
rep by rep, and the table adds each tree's ratio to the first.

The seam for another engine on the same model: ``write_model`` makes the tiny model a Hugging
Face folder (config, safetensors, tokenizer) that transformers loads as it is, and an engine is
one entry of ``ENGINES``: a function (model folder, streams, steps) -> seconds for one
``generate`` of that many greedy tokens per stream, ignoring EOS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = 8  # tokens per stream's prompt


def write_model(folder: Path, layers: int = 2) -> Path:
    """The tiny random Llama (``tests/tiny_model.py``) as a Hugging Face folder."""
    sys.path.insert(0, str(ROOT))
    from tests.tiny_model import make_tiny_model

    return make_tiny_model(folder, layers=layers)


def attest_generate(model: str, streams: int) -> Callable[[int], float]:
    """Attest offline on the CPU with the tiny model: the seconds of one greedy ``generate``
    of ``n`` tokens per stream, each stream its own random prompt (no prefix shared)."""
    from engine import LLM, SamplingParams

    llm = LLM(
        model=model,
        kv_tokens=max(4096, streams * 512),
        max_running=max(64, streams),
        speculative="off",  # one token a step per stream: steps are what is counted
        threads=1,
    )
    vocab = llm.core.model_config.vocab_size
    rng = random.Random(0)

    def run(n: int) -> float:
        prompts = [[rng.randrange(3, vocab) for _ in range(PROMPT)] for _ in range(streams)]
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        t0 = time.perf_counter()
        out = llm.generate(prompts, [params] * streams)
        dt = time.perf_counter() - t0
        if any(len(o.token_ids) != n for o in out):
            raise AssertionError("a stream generated a different number of tokens")
        return dt

    return run


ENGINES: dict[str, Callable[[str, int], Callable[[int], float]]] = {"attest": attest_generate}


def steps_per_s(run: Callable[[int], float], steps: int, reps: int) -> float:
    """Decode steps per second: ``steps`` more tokens per stream over the seconds they added."""
    run(2)  # warm-up
    one = statistics.median(run(1) for _ in range(reps))
    many = statistics.median(run(1 + steps) for _ in range(reps))
    return steps / max(many - one, 1e-9)


def measure(engine: str, model: str, streams: list[int], steps: int, reps: int) -> dict:
    return {str(s): steps_per_s(ENGINES[engine](model, s), steps, reps) for s in streams}


def child(tree: str, args: argparse.Namespace, model: str) -> dict:
    """One measurement in a child process importing ``tree``'s engine."""
    cmd = [sys.executable, __file__, "--child", "--model", model, "--streams", args.streams]
    cmd += ["--steps", str(args.steps), "--reps", "1", "--engine", args.engine]
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def table(results: dict[str, list[dict]], streams: list[int]) -> str:
    trees = list(results)
    lines = [
        "| tree | streams | steps/s | ms/step | tok/s | vs first |",
        "|---|---|---|---|---|---|",
    ]
    for s in streams:
        base = statistics.median(r[str(s)] for r in results[trees[0]])
        for t in trees:
            v = statistics.median(r[str(s)] for r in results[t])
            lines.append(
                f"| {t} | {s} | {v:.1f} | {1000 / v:.2f} | {v * s:.0f} | {v / base:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", default="1,64")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--engine", default="attest", choices=sorted(ENGINES))
    p.add_argument("--trees", default=".", help="engine trees, comma-separated")
    p.add_argument("--model", help="a model folder (default: the tiny model, written afresh)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    if args.child:
        print(json.dumps(measure(args.engine, args.model, streams, args.steps, args.reps)))
        return
    sys.path.insert(0, str(ROOT))
    from cpuinfo import describe  # bench/cpuinfo.py, beside this script

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(write_model(Path(tmp) / "tiny"))
        trees = args.trees.split(",")
        results: dict[str, list[dict]] = {t: [] for t in trees}
        for _ in range(args.reps):  # trees alternate, so drift in the machine hits both
            for t in trees:
                results[t].append(child(t, args, model))
    print(f"CPU: {describe()}")
    print(f"engine {args.engine}, tiny model (2 layers, hidden 64), prompt {PROMPT}, ", end="")
    print(f"{args.steps} decode steps, {args.reps} reps, median")
    print(table(results, streams))


if __name__ == "__main__":
    main()
