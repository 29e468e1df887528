"""The attention backend at the engine level: the Triton kernels (under Triton's interpreter)
give the same greedy tokens as the torch reference, and a backend that cannot run here stops the
engine at boot with the reason."""

from __future__ import annotations

import random

import pytest

import tests.triton_interpret  # noqa: F401  (before any triton import: selects the interpreter)
from engine import LLM, SamplingParams
from tests.triton_interpret import interpreted_kernels


def greedy_tokens(model: str, backend: str, prompts, params) -> list[list[int]]:
    # small chunks and pages of 4: chunked prefill extends over a cached prefix, and the
    # shared prompt head is reused through the prefix cache
    llm = LLM(
        model=model,
        attention_backend=backend,
        kv_tokens=4096,
        page_size=4,
        chunk_tokens=24,
        max_running=8,
        check_invariants=True,
    )
    assert llm.core.describe()["attention_backend"] == backend
    try:
        return [o.token_ids for o in llm.generate(prompts, params)]
    finally:
        llm.close()


@pytest.mark.slow
def test_triton_greedy_output_equals_torch(tiny_model_dir, monkeypatch):
    if interpreted_kernels() is None:
        pytest.skip("needs triton running under its interpreter")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rng = random.Random(3)
    head = [rng.randrange(2, 200) for _ in range(30)]
    prompts = [head + [rng.randrange(2, 200) for _ in range(rng.randint(1, 40))] for _ in range(5)]
    prompts.append([rng.randrange(2, 200) for _ in range(3)])
    params = [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True) for _ in prompts]
    want = greedy_tokens(tiny_model_dir, "torch", prompts, params)
    got = greedy_tokens(tiny_model_dir, "triton", prompts, params)
    assert got == want


def test_triton_on_cpu_without_the_interpreter_stops_the_boot(tiny_model_dir, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        LLM(model=tiny_model_dir, attention_backend="triton", kv_tokens=256)


def test_flashinfer_without_cuda_stops_the_boot(tiny_model_dir):
    with pytest.raises(ValueError, match="'flashinfer' needs a CUDA device"):
        LLM(model=tiny_model_dir, attention_backend="flashinfer", kv_tokens=256)


def test_auto_on_cpu_is_the_torch_reference(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, kv_tokens=256)
    try:
        assert llm.config.model.attention_backend == "auto"
        assert llm.core.describe()["attention_backend"] == "torch"
    finally:
        llm.close()
