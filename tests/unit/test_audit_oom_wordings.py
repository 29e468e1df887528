"""Running out of memory in each wording the engines' logs carry, read as OOM by the shipped
windows' ``no_oom``: PyTorch's 'CUDA out of memory.' and ROCm's 'HIP out of memory.', the CUDA
runtime's 'CUDA error: out of memory', vLLM's KV cache left without memory or too small for one
request, SGLang's allocator's and its refusal to start, FlashInfer's workspace, the host's
allocator; through the engine's logger or as the whole line that ends a traceback. Lines that
only mention memory (a sizing notice, a retraction, a prompt quoting the words) are not OOM.
The line shapes are those of the issue threads the cases cite."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.spec import resolve
from audit.verdict import evaluate

V_STATS = (
    "INFO 01-22 18:27:15 metrics.py:449] Avg prompt throughput: 812.3 tokens/s, Avg generation "
    "throughput: 41.7 tokens/s, Running: 16 reqs, Swapped: 0 reqs, Pending: 48 reqs, GPU KV cache "
    "usage: 99.2%, CPU KV cache usage: 0.0%."
)
S_BATCH = (
    "[2025-01-01 12:00:00 TP0] Decode batch. #running-req: 8, #token: 2048, token usage: 0.50, "
    "gen throughput (token/s): 812.40, #queue-req: 0"
)
V_HEAD = "(EngineCore_DP0 pid=7) ERROR 05-19 10:13:15 [core.py:710] "
CPU = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:119] err == 0. DefaultCPUAllocator: can't "
    "allocate memory: you tried to allocate 4398046511104 bytes. Error code 12 (Cannot allocate "
    "memory)"
)
CUDA_ERROR = "torch.AcceleratorError: CUDA error: out of memory"
HIP = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.08 GiB."

VLLM_OOM = [
    V_HEAD + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    V_HEAD + HIP,
    V_HEAD + CUDA_ERROR,
    V_HEAD + "RuntimeError: CUDA error: out of memory",
    "ERROR 01-08 09:20:26 engine.py:135] RuntimeError('CUDA error: out of memory')",
    "ERROR 01-08 09:20:26 engine.py:135] OutOfMemoryError('HIP out of memory. Tried to allocate')",
    V_HEAD + "ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine.",
    "(EngineCore_DP0 pid=1094) ValueError: To serve at least one request with the models's max "
    "seq len (262144), (24.0 GiB KV cache is needed, which is larger than the available KV cache "
    "memory (3.18 GiB).",
    "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that "
    "can be stored in KV cache (3664). Try increasing `gpu_memory_utilization`",
    "ERROR 10-06 00:29:54 [engine.py:506] " + CPU,
    CPU,
    CUDA_ERROR,
    HIP,
]
SGLANG_OOM = [
    "[2024-11-20 16:40:55 TP0] Prefill out of memory. Try to lower your batch size.",
    "[2026-01-05 06:12:41] Decode out of memory. Try to lower your batch size.",
    "RuntimeError: Prefill out of memory. Try to lower your batch size.",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    HIP,
    CUDA_ERROR,
    "RuntimeError: CUDA error: out of memory",
    "RuntimeError: Failed to allocate memory for batch_prefill_tmp_v with size 435814400 and "
    "alignment 16 in AlignedAllocator",
    CPU,
]
NOT_OOM = [  # memory named, nothing ran out
    "(EngineCore pid=316) INFO 08-21 18:37:44 [gpu_worker.py:492] Initial free memory 31.16 GiB, "
    "reserved 4.25 GiB memory for KV Cache. If OOM'ed, check the difference of initial free memory",
    "INFO 03-10 08:07:20 [gpu_worker.py:298] Available KV cache memory: 12.52 GiB",
    "INFO 01-01 00:00:00 [logger.py:39] Received request cmpl-1: prompt: 'why does torch say "
    "RuntimeError: CUDA error: out of memory?'",
    "[2025-01-01 12:00:01 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1",
    "[2025-01-01 12:00:00 TP0] Load weight end. avail mem=21.73 GB, mem usage=16.59 GB.",
    "client: the server said RuntimeError: CUDA error: out of memory",
    "# tip: on HIP out of memory. lower --mem-fraction-static",
]


def no_oom(tmp_path: Path, window: str, first: str, line: str) -> str:
    log = tmp_path / "engine.log"
    log.write_text(f"{first}\n{line}\n", encoding="utf-8")
    report = evaluate([resolve(window)], [log])
    return next(c for c in report.specs[0].claims if c.claim == "no_oom").status.value


@pytest.mark.parametrize("line", VLLM_OOM)
def test_vllm_out_of_memory_in_each_wording_fails_no_oom(tmp_path, line):
    assert no_oom(tmp_path, "vllm_pressure", V_STATS, line) == "FAIL"


@pytest.mark.parametrize("line", SGLANG_OOM)
def test_sglang_out_of_memory_in_each_wording_fails_no_oom(tmp_path, line):
    assert no_oom(tmp_path, "sglang_pressure", S_BATCH, line) == "FAIL"


@pytest.mark.parametrize("line", NOT_OOM)
@pytest.mark.parametrize(
    ("window", "first"), [("vllm_pressure", V_STATS), ("sglang_pressure", S_BATCH)]
)
def test_a_line_that_only_names_memory_is_not_an_oom(tmp_path, window, first, line):
    assert no_oom(tmp_path, window, first, line) == "PASS"
