"""Offline throughput: Attest's LLM.generate against transformers' batched generate on the same
weights, and Attest with receipts on against receipts off, measured in one run.

Each arm is timed ``runs`` times (after one warm-up) and reported as its median; ratios compare
medians. Prompts are random token ids of a fixed length; every request generates exactly
``output_len`` tokens (EOS ignored), greedy.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from measure.method import load_transformers, transformers_generate


@dataclass(slots=True)
class ArmResult:
    name: str
    seconds: list[float]
    output_tokens: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.median_s


def _workload(n: int, prompt_len: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(n)]


def _time_once(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_offline(
    model: str | None,
    num_prompts: int,
    prompt_len: int,
    output_len: int,
    runs: int = 3,
    dtype: str = "float32",
    max_running: int = 64,
    baseline: bool = True,
    seed: int = 0,
    tp: int = 1,
) -> list[ArmResult]:
    from engine import LLM, SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    kv = num_prompts * (prompt_len + output_len) + 64
    # a group cannot empty one rank's prefix cache alone: with several ranks the cache is off
    opts = dict(
        model=model,
        dtype=dtype,
        kv_tokens=kv,
        max_running=max_running,
        tp=tp,
        prefix_cache=tp == 1,
        speculative="off",
    )
    total = num_prompts * output_len
    with tempfile.TemporaryDirectory() as tmp:
        log = str(Path(tmp) / "boot.jsonl")
        if tp == 1:
            on, off = LLM(log_file=log, **opts), LLM(receipts=False, **opts)
            prompts = _workload(num_prompts, prompt_len, on.core.model_config.vocab_size, seed)
            results = _receipt_arms(on, off, prompts, params, total, runs)
            arms = [off, on]
        else:  # one multi-rank engine per process at a time: the arms run one after the other
            on = LLM(log_file=log, **opts)
            prompts = _workload(num_prompts, prompt_len, on.core.model_config.vocab_size, seed)
            t_on = _receipt_arms(on, None, prompts, params, total, runs)
            on.close()
            off = LLM(receipts=False, **opts)
            results = t_on + _receipt_arms(None, off, prompts, params, total, runs)
            arms = [off]
        path = on.core.loaded.path
        for llm in arms:  # its ranks stop; weights and pools go before transformers loads its own
            llm.close()
        del on, off, arms
        if baseline:
            hf_arm = _transformers_arm(path, dtype, prompts, output_len, runs)
            results.append(hf_arm)
    return results


def _receipt_arms(on, off, prompts, params, total: int, runs: int) -> list[ArmResult]:
    """Attest with receipts on and off (either None: that arm is not run here), alternated run
    by run so machine drift hits both alike."""

    def attest(llm):
        def go():
            outs = llm.generate(prompts, params)
            assert sum(len(o.token_ids) for o in outs) == total
            llm.core.scheduler.cache.reset_to_empty()  # every run starts cold

        return go

    arms = [
        (name, llm)
        for name, llm in (("attest (receipts on, boot log)", on), ("attest (receipts off)", off))
        if llm is not None
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in arms}
    for _, llm in arms:
        attest(llm)()  # warm-up
    for _ in range(runs):
        for name, llm in arms:
            times[name].append(_time_once(attest(llm)))
    return [ArmResult(name, times[name], total) for name, _ in arms]


def _transformers_arm(
    path: str, dtype: str, prompts: list[list[int]], output_len: int, runs: int
) -> ArmResult:
    """transformers' batched generate on the same weights and prompts, greedy, exactly
    ``output_len`` new tokens each (``method.transformers_generate``, which checks the shape)."""
    go = transformers_generate(load_transformers(path, dtype))
    go(prompts, output_len)  # warm-up
    times = [go(prompts, output_len) for _ in range(runs)]
    return ArmResult("transformers generate (one batch)", times, len(prompts) * output_len)
