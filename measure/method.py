"""How a decode rate and a prefill rate are measured, the same way for every engine.

An engine is reached through a ``Generate``: ``go(prompts, new) -> seconds`` runs one batched,
greedy generate of exactly ``new`` tokens per prompt (EOS ignored) and returns its wall time.
For N streams the decode rate is N * new / (t(new + 1 tokens) - t(1 token)), each generate on
fresh prompts: the prefill and the first token are timed apart and taken out (a pair the noise
made shorter than its one-token run is timed again). End-to-end output
tok/s is N * (new + 1) / t(new + 1 tokens), prefill included. Prefill tok/s is one prompt's
length over t(1 token).

Every prompt starts with a token no earlier prompt of that engine had, so no two share a prefix;
Attest's prefix cache is also emptied before each generate, and every request's
``request.finish`` receipt is asserted to show cached == 0: a prefill served from the cache is
not work.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

from engine.core.threads import usable_cpus

Generate = Callable[[list[list[int]], int], float]


class Prompts:
    """Fresh random prompts; the first token of each is new, so no two share a prefix."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        # first tokens from 1000 up, clear of a real vocabulary's special tokens; a test
        # model's small vocabulary starts past the three usual ones
        self.firsts = iter(range(1000 if vocab > 10_000 else 3, vocab))
        self.vocab = vocab

    def take(self, n: int, length: int) -> list[list[int]]:
        out = []
        for _ in range(n):
            first = next(self.firsts, None)
            if first is None:
                raise ValueError(f"no fresh first token left in a vocabulary of {self.vocab}")
            out.append([first, *(self.rng.randrange(3, self.vocab) for _ in range(length - 1))])
        return out


TRIES = 3  # pairs of generates timed before a decode rate is given up as unmeasurable


def decode_rate(
    go: Generate, prompts: Prompts, n: int, length: int, new: int
) -> tuple[float, float]:
    """(decode tok/s, end-to-end output tok/s) of ``n`` streams of ``length``-token prompts.
    A pair whose full generate took no longer than its one-token one (the machine's noise
    larger than the decode's time) is timed again, on fresh prompts; ValueError after
    ``TRIES`` such pairs, never a negative or infinite rate."""
    seen = []
    for _ in range(TRIES):
        first = go(prompts.take(n, length), 1)
        full = go(prompts.take(n, length), new + 1)
        if full > first:
            return n * new / (full - first), n * (new + 1) / full
        seen.append(f"{full:.3f} s against {first:.3f} s")
    raise ValueError(
        f"{n} streams: the generate of {new + 1} tokens took no longer than the one of 1 token "
        f"{TRIES} times ({'; '.join(seen)}): the machine's noise is larger than {new} decode "
        f"steps; measure with more new tokens or on a quieter machine"
    )


def prefill_rate(go: Generate, prompts: Prompts, length: int) -> float:
    """tok/s of one ``length``-token prompt no engine run has seen, to its first token."""
    return length / go(prompts.take(1, length), 1)


def attest_generate(llm, guide=None) -> Generate:
    """``LLM.generate`` from an empty prefix cache, every request asserted uncached. ``guide``:
    every request constrained by it (one no output of ``new`` tokens can complete, so each still
    runs ``new`` tokens; a guide ends at the grammar's end, EOS is not ignored)."""
    from engine import SamplingParams

    def go(ids: list[list[int]], new: int) -> float:
        llm.core.scheduler.cache.reset_to_empty()
        params = SamplingParams(
            max_tokens=new, temperature=0, ignore_eos=guide is None, guide=guide
        )
        t = time.perf_counter()
        outs = llm.generate(ids, params)
        dt = time.perf_counter() - t
        assert all(len(o.token_ids) == new for o in outs)
        fins = llm.core.receipts.of("request.finish")[-len(ids) :]
        assert len(fins) == len(ids) and all(f["cached"] == 0 for f in fins), "a prefix-cache hit"
        return dt

    return go


def transformers_generate(hf) -> Generate:
    """transformers' batched ``generate``, greedy, exactly ``new`` tokens per prompt."""
    import torch

    def go(ids: list[list[int]], new: int) -> float:
        x = torch.tensor(ids)  # equal lengths: no padding needed
        kw = dict(attention_mask=torch.ones_like(x), do_sample=False, top_p=None, top_k=None)
        with torch.inference_mode():
            t = time.perf_counter()
            out = hf.generate(x, max_new_tokens=new, min_new_tokens=new, **kw)
            dt = time.perf_counter() - t
        assert out.shape == (len(ids), x.shape[1] + new)
        return dt

    return go


def load_transformers(path: str, dtype: str = "float32"):
    """transformers' model of the same weights (a GGUF file, dequantised, or an HF folder)."""
    import torch
    from transformers import AutoModelForCausalLM

    p = Path(path)
    where, kw = (str(p.parent), {"gguf_file": p.name}) if p.suffix == ".gguf" else (str(p), {})
    return AutoModelForCausalLM.from_pretrained(where, dtype=getattr(torch, dtype), **kw).eval()


def _cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def describe_cpu() -> str:
    """The CPU: its model (name, and family, model and stepping numbers and clock, which tell
    apart CPUs of one name), the cores this process may use (of how many, where fewer) and its
    vector and matrix flags (AVX2, AVX-512, VNNI, AMX). This machine kind's CPU varies
    (AVX-512 one day, AVX2 only the next), so every table is printed with it."""
    info = _cpuinfo()
    if info is None:
        return "unknown CPU"
    first = dict(
        (k.strip(), v.strip())
        for k, _, v in (ln.partition(":") for ln in info.split("\n\n", 1)[0].splitlines())
    )
    numbers = " ".join(
        f"{name} {first[key]}"
        for name, key in (("family", "cpu family"), ("model", "model"), ("stepping", "stepping"))
        if key in first
    )
    if "cpu MHz" in first:
        numbers += f", {float(first['cpu MHz']):.0f} MHz"
    model = first.get("model name", "?") + (f" ({numbers})" if numbers else "")
    total, usable = os.cpu_count() or 1, usable_cpus()
    cores = f"{usable} cores" if usable == total else f"{usable} of {total} cores"
    flags = sorted(set(re.findall(r"\b(avx2|avx512[a-z_0-9]*|avx_vnni|amx_[a-z0-9]+)\b", info)))
    return f"{model}, {cores}; flags: {' '.join(flags) or 'no avx2/avx512'}"
