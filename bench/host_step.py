"""The host's share of a decode step: scheduler steps per second at 1 and 64 streams on a tiny
random model, where the forward's arithmetic is negligible, so what is timed is the host's work
per step (the scheduler's loop, the batch's tensors built, Python per layer, the sampler).

Each stream's prompt is prefilled first; a step then gives every stream one token (speculation
off), so decode steps per second = extra tokens per stream / the extra seconds they took
(``generate`` with 1 new token and with 1 + ``--steps``, medians of ``--reps``).

    .venv/bin/python bench/host_step.py [--streams 1,64] [--steps 64] [--reps 3]
    .venv/bin/python bench/host_step.py --trees OTHER_TREE,.   # before/after in one sitting
    .venv/bin/python bench/host_step.py --engines attest,vllm   # against vLLM's CPU build
    .venv/bin/python bench/host_step.py --engines attest,attest-overlap   # the next step planned
                                                                          # beside the forward

Each arm (a tree's Attest, or vLLM) runs in a child process of its own, the arms alternating
rep by rep, and the table adds each arm's ratio to the first. vLLM's arm is its offline engine
(``measure/vllm_cpu.py``'s worker, in its own environment: ``engine bench --install-vllm``
makes it) in float32, as Attest runs the tiny model, compiled as vLLM compiles by default; with
it in the run the tiny model is 128 wide (heads of 32, the least vLLM's CPU attention takes)
for every arm.

The seam for another engine on the same model: ``write_model`` makes the tiny model a Hugging
Face folder (config, safetensors, tokenizer) that transformers loads as it is, and an engine is
one entry of ``ENGINES``: a function (model folder, streams, steps) -> seconds for one
``generate`` of that many greedy tokens per stream, ignoring EOS.
"""

from __future__ import annotations

import argparse
import functools
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


def write_model(folder: Path, layers: int = 2, hidden: int = 64) -> Path:
    """The tiny random Llama (``tests/tiny_model.py``) as a Hugging Face folder."""
    sys.path.insert(0, str(ROOT))
    from tests.tiny_model import make_tiny_model

    return make_tiny_model(folder, layers=layers, hidden=hidden)


def label(tree: str, engine: str, trees: list[str]) -> str:
    """An arm's name in the table: the tree for Attest's arms when there are several."""
    if engine != "attest":
        return engine
    return tree if len(trees) > 1 else "attest"


def attest_generate(model: str, streams: int, overlap: bool = False) -> Callable[[int], float]:
    """Attest offline on the CPU with the tiny model: the seconds of one greedy ``generate``
    of ``n`` tokens per stream, each stream its own random prompt (no prefix shared).
    ``overlap``: each step planned while the step before it runs (``--overlap-schedule``)."""
    from engine import LLM, SamplingParams

    llm = LLM(
        model=model,
        kv_tokens=max(4096, streams * 512),
        max_running=max(64, streams),
        speculative="off",  # one token a step per stream: steps are what is counted
        threads=1,
        overlap_schedule=overlap,
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


def vllm_generate(model: str, streams: int) -> Callable[[int], float]:
    """vLLM's CPU build with the same tiny model: the seconds of one ``LLM.generate`` of ``n``
    tokens per stream (greedy, EOS ignored, prefix caching off), as ``attest_generate``."""
    import atexit

    sys.path.insert(0, str(ROOT))
    from measure.vllm_cpu import ENV, VllmWorker, WorkerSpec
    from tests.tiny_model import VOCAB

    spec = WorkerSpec(model, "float32", max_seqs=max(64, streams), max_len=512)
    worker = VllmWorker(ROOT / ENV, spec, stderr=subprocess.DEVNULL)
    atexit.register(worker.close)
    rng = random.Random(0)

    def run(n: int) -> float:
        prompts = [[rng.randrange(3, VOCAB) for _ in range(PROMPT)] for _ in range(streams)]
        return worker.generate(prompts, n)  # checks every stream got n tokens

    return run


ENGINES: dict[str, Callable[[str, int], Callable[[int], float]]] = {
    "attest": attest_generate,
    "attest-overlap": functools.partial(attest_generate, overlap=True),
    "vllm": vllm_generate,
}


def steps_per_s(run: Callable[[int], float], steps: int, reps: int) -> float:
    """Decode steps per second: ``steps`` more tokens per stream over the seconds they added."""
    run(2)  # warm-up
    one = statistics.median(run(1) for _ in range(reps))
    many = statistics.median(run(1 + steps) for _ in range(reps))
    if many <= one:  # the noise swallowed the steps: no rate, rather than a huge one
        raise SystemExit(f"{steps} more steps took no time ({many:.4f} s against {one:.4f} s)")
    return steps / (many - one)


def measure(engine: str, model: str, streams: list[int], steps: int, reps: int) -> dict:
    return {str(s): steps_per_s(ENGINES[engine](model, s), steps, reps) for s in streams}


def child(tree: str, engine: str, args: argparse.Namespace, model: str) -> dict:
    """One measurement of ``engine`` in a child process importing ``tree``'s code."""
    cmd = [sys.executable, __file__, "--child", "--model", model, "--streams", args.streams]
    cmd += ["--steps", str(args.steps), "--reps", "1", "--engines", engine]
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def table(results: dict[str, list[dict]], streams: list[int]) -> str:
    trees = list(results)
    lines = [
        "| arm | streams | steps/s | ms/step | tok/s | vs first |",
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
    p.add_argument("--engines", default="attest", help=f"of {', '.join(ENGINES)}, comma-separated")
    p.add_argument("--trees", default=".", help="Attest's trees, comma-separated")
    p.add_argument("--model", help="a model folder (default: the tiny model, written afresh)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    engines = args.engines.split(",")
    if unknown := set(engines) - set(ENGINES):
        p.error(f"--engines: unknown {', '.join(sorted(unknown))} (known: {', '.join(ENGINES)})")
    if args.child:
        print(json.dumps(measure(engines[0], args.model, streams, args.steps, args.reps)))
        return
    sys.path.insert(0, str(ROOT))
    from cpuinfo import describe  # bench/cpuinfo.py, beside this script

    hidden = 128 if "vllm" in engines else 64
    trees = args.trees.split(",")
    arms = [(t, e) for e in engines for t in (trees if e == "attest" else trees[:1])]
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(write_model(Path(tmp) / "tiny", hidden=hidden))
        results: dict[str, list[dict]] = {label(t, e, trees): [] for t, e in arms}
        for _ in range(args.reps):  # arms alternate, so drift in the machine hits each
            for t, e in arms:
                results[label(t, e, trees)].append(child(t, e, args, model))
    print(f"CPU: {describe()}")
    print(f"tiny model (2 layers, hidden {hidden}), prompt {PROMPT}, ", end="")
    print(f"{args.steps} decode steps, {args.reps} reps, median")
    print(table(results, streams))


if __name__ == "__main__":
    main()
