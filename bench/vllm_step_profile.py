"""What vLLM's CPU build runs for a 64-stream decode step and a 64-prompt prefill, in bfloat16 on
the default model: torch.profiler's top ops by self CPU time, and oneDNN's primitives by time
with the implementation (and so the ISA) each ran, from ``ONEDNN_VERBOSE=1``.

The model runs in the worker's own process (measure/vllm_cpu.py ``WorkerSpec.in_process``), so
the profiler sees its ops. The prefill is one generate of 64 fresh prompts asking one token;
the decode step is a generate asking ``1 + steps`` tokens less that prefill (per op: its time
and calls in the longer generate less those in the prefill-only one), over the forward passes
that difference holds: its count of greedy samplings (``_C::greedy_argmax``, one a pass), which
vLLM can make one more than ``steps``. Every timed generate follows a warm-up of its own shape,
so compiling is not in it.

    .venv/bin/python bench/vllm_step_profile.py [--streams 64] [--prompt 128] [--steps 8]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cpuinfo import describe  # noqa: E402  (bench/cpuinfo.py, beside this script)

from measure import vllm_cpu  # noqa: E402
from measure.method import Prompts  # noqa: E402

SAMPLER = "_C::greedy_argmax"  # vLLM's greedy sampling: one call a forward pass


def onednn(lines: list[str]) -> tuple[dict[tuple[str, str], list[float]], list[str]]:
    """oneDNN's verbose lines: (primitive kind, implementation) -> [calls, ms]; and its info
    lines (the ISA it found, its version)."""
    by: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    info = []
    for ln in lines:
        if not ln.startswith("onednn_verbose"):
            continue
        f = ln.strip().split(",")
        if "exec" in f:
            i = f.index("exec")
            try:
                ms = float(f[-1])
            except ValueError:
                continue
            cell = by[(f[i + 2], f[i + 3])]
            cell[0] += 1
            cell[1] += ms
        elif "info" in f and re.search(r"oneDNN v|isa:|runtime:", ln):
            info.append(",".join(f[f.index("info") + 1 :]))
    return by, info


def _segment(log: Path, start: int) -> tuple[list[str], int]:
    text = log.read_text(errors="replace")
    return text[start:].splitlines(), len(text)


def _ops_table(title: str, ops: dict[str, tuple[float, int]], total: float, top: int) -> str:
    rows = sorted(ops.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
    out = [f"{title} (self CPU ms, share of the profiled total {total:.1f} ms)", ""]
    out += ["| op | ms | share | calls |", "|---|---:|---:|---:|"]
    out += [f"| `{k}` | {ms:.1f} | {ms / total:.0%} | {n:g} |" for k, (ms, n) in rows]
    return "\n".join(out)


def _onednn_table(title: str, by: dict, scale: float = 1.0) -> str:
    rows = sorted(by.items(), key=lambda kv: kv[1][1], reverse=True)[:10]
    out = [f"{title}", "", "| primitive | implementation | calls | ms |", "|---|---|---:|---:|"]
    out += [f"| {k} | {impl} | {n * scale:.0f} | {ms * scale:.1f} |" for (k, impl), (n, ms) in rows]
    return "\n".join(out)


def _by_op(prof: dict) -> dict[str, tuple[float, int]]:
    return {r["op"]: (r["self_ms"], r["calls"]) for r in prof["ops"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    from engine.model.loader import default_model_path

    folder = vllm_cpu.hf_folder(default_model_path())
    ws = vllm_cpu.WorkerSpec(
        str(folder), "bfloat16", args.streams, args.prompt + args.steps + 2, in_process=True
    )
    n, new = args.streams, args.steps + 1
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "worker.stderr"
        with (
            open(log, "w") as err,
            vllm_cpu.VllmWorker(vllm_cpu.ENV, ws, {"ONEDNN_VERBOSE": "1"}, stderr=err) as w,
        ):
            prompts = Prompts(w.info["vocab"])
            w.generate(prompts.take(n, args.prompt), 1)  # warm-ups: every shape compiled
            w.generate(prompts.take(n, args.prompt), new)
            _, at = _segment(log, 0)
            pre = w.profile(prompts.take(n, args.prompt), 1, top=200)
            pre_lines, at = _segment(log, at)
            full = w.profile(prompts.take(n, args.prompt), new, top=200)
            full_lines, _ = _segment(log, at)
            log_lines, _ = _segment(log, 0)
            info = w.info
    pre_ops, full_ops = _by_op(pre), _by_op(full)
    diff = {
        k: (ms - pre_ops.get(k, (0.0, 0))[0], c - pre_ops.get(k, (0, 0))[1])
        for k, (ms, c) in full_ops.items()
    }
    passes = diff.get(SAMPLER, (0, 0))[1] or args.steps
    step = {k: (ms / passes, round(c / passes, 1)) for k, (ms, c) in diff.items()}
    step_total = (full["total_self_ms"] - pre["total_self_ms"]) / passes
    _, dnn_info = onednn(log_lines)
    pre_dnn, _ = onednn(pre_lines)
    full_dnn, _ = onednn(full_lines)
    step_dnn = {
        k: [(v[0] - pre_dnn.get(k, [0, 0])[0]), v[1] - pre_dnn.get(k, [0, 0.0])[1]]
        for k, v in full_dnn.items()
    }
    print(f"cpu: {describe()}")
    print(
        f"vllm-cpu {info['version']}, {info['dtype']}, compilation {info['compilation']}, "
        f"{' '.join(f'{k}={v}' for k, v in sorted(info['env'].items()))}"
    )
    print(f"oneDNN: {'; '.join(dnn_info) or 'no info lines'}")
    print(f"prefill of {n} x {args.prompt}: {pre['seconds']:.2f} s wall\n")
    print(_ops_table(f"prefill, {n} prompts", pre_ops, pre["total_self_ms"], args.top))
    print()
    title = f"one decode step, {n} streams ({passes} passes in {args.steps} steps' difference)"
    print(_ops_table(title, step, step_total, args.top))
    print()
    print(_onednn_table("oneDNN, prefill", pre_dnn))
    print()
    print(_onednn_table("oneDNN, one decode step", step_dnn, 1 / passes))


if __name__ == "__main__":
    main()
