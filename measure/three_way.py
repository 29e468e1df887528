"""`engine bench --table`: Attest's arms against transformers, llama.cpp and vLLM's CPU build on
the same GGUF, in one run, measured by one method (measure/method.py).

The engines run one after the other, never side by side: one engine is alive at a time (an
Attest arm is closed, transformers' model dropped, llama.cpp's or vLLM's worker ended before the
next loads), so no two share memory or cores. Every arm sees the same prompts in the same order
(one seed); llama.cpp runs on as many threads as torch does in this process, vLLM's OpenMP
threads are bound to every CPU this process may use. With ``rounds`` the whole sequence runs
again, each round's order rotated (measure/table.py says why), every arm loaded afresh.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from measure.method import (
    Generate,
    Prompts,
    attest_generate,
    decode_rate,
    describe_cpu,
    load_transformers,
    prefill_rate,
    transformers_generate,
)
from measure.table import (
    ATTEST_ARMS,
    BASELINES,
    VLLM_ARMS,
    ArmFigures,
    TableSpec,
    merged,
    peer_row,
)
from measure.vllm_cpu import WorkerSpec

Say = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(slots=True)
class TableRun:
    """The arms' figures, per round, and the conditions they were measured in."""

    spec: TableSpec
    rounds: list[list[ArmFigures]] = field(default_factory=list)  # arms in the spec's order
    notes: list[str] = field(default_factory=list)  # what ran, one line each

    @property
    def arms(self) -> list[ArmFigures]:
        """Each arm's runs from every round together."""
        return merged(self.rounds)


Arm = Callable[[], tuple[ArmFigures, str]]  # one arm loaded, measured, closed: figures, note


def measure(
    name: str, engine: str, go: Generate, vocab: int, spec: TableSpec, say: Say
) -> ArmFigures:
    """One arm: per stream count a warm-up, then ``runs`` decode rates; then the prefill."""
    prompts, fig = Prompts(vocab, spec.seed), ArmFigures(name, engine)
    for n in spec.streams:
        go(prompts.take(n, spec.prompt_len), 4)  # warm-up at this batch size
        fig.decode[n] = [
            decode_rate(go, prompts, n, spec.prompt_len, spec.output_len) for _ in range(spec.runs)
        ]
        say(f"  {name}, {n} streams: decode {[round(r[0], 1) for r in fig.decode[n]]} tok/s")
    if spec.prefill:
        prefill_rate(go, prompts, spec.prefill)  # warm-up
        fig.prefill = [prefill_rate(go, prompts, spec.prefill) for _ in range(spec.runs)]
        say(f"  {name}, prefill {spec.prefill}: {[round(p, 1) for p in fig.prefill]} tok/s")
    return fig


def run_table(spec: TableSpec, say: Say = _stderr) -> TableRun:
    """Measure every arm of ``spec``, ``spec.rounds`` times, round r's order rotated by r arms
    (two arms: A B, then B A); progress goes to ``say`` as it comes. An arm's note is its first
    round's."""
    path = _check(spec)
    out = TableRun(spec)
    out.notes.append(f"cpu: {describe_cpu()}")
    out.notes.append(f"model: {path}")
    out.notes.append(f"load average before: {os.getloadavg()[0]:.2f}")
    arms = _arms(spec, path, say)
    notes: dict[int, str] = {}
    for r in range(spec.rounds):
        k = r % len(arms)
        order = list(range(len(arms)))[k:] + list(range(k))
        if spec.rounds > 1:
            say(f"round {r + 1} of {spec.rounds}")
        figs: dict[int, ArmFigures] = {}
        for i in order:
            figs[i], note = arms[i]()
            notes.setdefault(i, note)
        out.rounds.append([figs[i] for i in range(len(arms))])
    out.notes += [notes[i] for i in range(len(arms))]
    out.notes.append(f"load average after: {os.getloadavg()[0]:.2f}")
    return out


def _arms(spec: TableSpec, path: str, say: Say) -> list[Arm]:
    """Every arm of ``spec`` in its order, each a call that loads, measures and closes it."""
    arms: list[Arm] = []
    for engine in spec.engines:
        if engine == "attest":
            arms += [partial(_attest_arm, arm, path, spec, say) for arm in spec.attest]
        elif engine == "transformers":
            arms.append(partial(_transformers_arm, path, spec, say))
        elif engine == "llamacpp":
            arms.append(partial(_llamacpp_arm, path, spec, say))
        else:
            arms += [partial(_vllm_arm, arm, path, spec, say) for arm in spec.vllm]
    return arms


def _transformers_arm(path: str, spec: TableSpec, say: Say) -> tuple[ArmFigures, str]:
    import torch

    say("transformers: loading (dequantising the GGUF to float32)")
    hf = load_transformers(path)
    try:
        go = transformers_generate(hf)
        fig = measure(
            BASELINES["transformers"], "transformers", go, hf.config.vocab_size, spec, say
        )
        return (
            fig,
            f"transformers: float32 batched generate, torch threads {torch.get_num_threads()}",
        )
    finally:  # its weights go before the next engine loads its own
        del hf
        gc.collect()


def _check(spec: TableSpec) -> str:
    """Everything that can be refused before any arm's minutes: Attest's arms' options, the
    peers' environments, the model; the model's path."""
    from engine.config import EngineConfig
    from engine.model.loader import resolve_model_path
    from measure import llamacpp, vllm_cpu

    for arm in spec.attest if "attest" in spec.engines else []:
        try:  # an arm whose option this engine lacks is refused before any arm runs
            EngineConfig.from_kwargs(**ATTEST_ARMS[arm])
        except TypeError as e:
            raise ValueError(f"--attest {arm}: LLM({_kwargs(ATTEST_ARMS[arm])}): {e}") from e
    if "llamacpp" in spec.engines:
        llamacpp.check_env(spec.llamacpp_env)
    if "vllm" in spec.engines:
        vllm_cpu.check_env(spec.vllm_env)
    path = resolve_model_path(spec.model)
    if "llamacpp" in spec.engines and not path.endswith(".gguf"):
        raise ValueError(f"llama.cpp needs a GGUF file; {path} is not one")
    return path


def _llamacpp_arm(path: str, spec: TableSpec, say: Say) -> tuple[ArmFigures, str]:
    import torch

    from measure.llamacpp import LlamaCppWorker

    threads = torch.get_num_threads()  # what torch runs on in this process
    say(f"llama.cpp: starting its worker ({spec.llamacpp_env}, {threads} threads)")
    with LlamaCppWorker(spec.llamacpp_env, path, threads) as w:
        fig = measure(BASELINES["llamacpp"], "llamacpp", w.generate, w.info["vocab"], spec, say)
        note = (
            f"llama.cpp: llama-cpp-python {w.info['version']}, batched low-level API "
            f"(llama_batch + llama_decode, one sequence id per stream, greedy argmax per "
            f"stream), n_threads = n_threads_batch = {threads} (= torch's), flash "
            f"attention {'on' if w.flash_attn else 'off'}, {w.info['kv']}; prefill "
            f"{w.info['prefill']}; {w.info['system']}"
        )
    return fig, note


def _vllm_arm(arm: str, path: str, spec: TableSpec, say: Say) -> tuple[ArmFigures, str]:
    """vLLM's arm in its own worker: the model's HF folder (made once from the GGUF), the
    dtype, as many sequences as the largest stream count, prefix caching off."""
    from measure.vllm_cpu import VllmWorker, WorkerSpec, hf_folder

    folder = hf_folder(path)
    ws = WorkerSpec(
        str(folder), VLLM_ARMS[arm], max(spec.streams), spec.longest(), spec.vllm_kv_gib
    )
    name = peer_row("vllm", arm)
    say(f"{name}: starting its worker ({spec.vllm_env}, {folder.name}, {ws.dtype})")
    with VllmWorker(spec.vllm_env, ws) as w:
        fig = measure(name, "vllm", w.generate, w.info["vocab"], spec, say)
        note = vllm_note(name, w.info, ws)
    return fig, note


def vllm_note(name: str, info: dict, ws: WorkerSpec) -> str:
    """What ran: vLLM's version, dtype, compilation and whether it compiled on this load (its
    compile cache grew) or reused the cache, load time, its CPU variables."""
    before, after = info["compile_cache_files"]
    compiled = (
        f"compiled on load ({after - before} cache files written)"
        if after > before
        else ("compile cache reused (no new cache files)")
    )
    env = " ".join(f"{k}={v}" for k, v in sorted(info["env"].items()))
    return (
        f"{name}: vllm-cpu {info['version']}, LLM.generate of token ids, dtype {info['dtype']}, "
        f"prefix caching off, max_num_seqs {ws.max_seqs}, max_model_len {ws.max_len}; "
        f"compilation {info['compilation']}, {compiled}, load {info['load_s']} s; {env}"
    )


def _attest_arm(arm: str, path: str, spec: TableSpec, say: Say) -> tuple[ArmFigures, str]:
    """The arm's figures, and what ran: its options and, in fast mode, its kernels' path."""
    import torch

    from engine import LLM

    say(f"attest {arm}: loading LLM({_kwargs(ATTEST_ARMS[arm])})")
    llm = LLM(
        model=path, kv_tokens=spec.kv_tokens(), max_running=max(spec.streams), **ATTEST_ARMS[arm]
    )
    try:
        note = f"attest {arm}: LLM({_kwargs(ATTEST_ARMS[arm])})"
        quant = getattr(llm.core, "quant", None)  # fast mode's plan: which kernels run here
        note += f" ({quant.path})" if quant is not None else ""
        note += _ways(llm.core.weights_fields())
        vocab = llm.core.model_config.vocab_size
        fig = measure(f"attest {arm}", "attest", attest_generate(llm), vocab, spec, say)
        return fig, f"{note}, torch threads {torch.get_num_threads()}"
    finally:  # its pools and weights go before the next engine loads its own
        llm.close()
        del llm
        gc.collect()


def _ways(fields: dict) -> str:
    """The dense products as the load measured them (``boot.weights``; fast mode's past its
    integer rows): the row buckets that took (W @ x.T).T and those that took oneDNN's packed
    weights, per part."""
    if "orient" not in fields and "prepacked" not in fields:
        return ""
    parts = [
        f"{part}: mm {fields.get('orient', {}).get(part, [])}, packed {packed}"
        for part, packed in fields.get("prepacked", {}).items()
        if part != "bytes"
    ]
    return f" (products by rows measured at load, {'; '.join(parts)})"


def _kwargs(kw: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kw.items())
