"""Which attention backend runs: ``auto`` resolved for the device, and a clear reason, raised at
boot, when the one asked for cannot run here.

It sits above the interface and the backends (each imports ``kernels.attention``), so the
imports among the kernels run one way.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import NamedTuple

import torch

from kernels.attention import AttentionBackend
from kernels.flashinfer_backend import FlashInferBackend
from kernels.torch_ref import TorchReferenceBackend
from kernels.triton_backend import TritonBackend

# torch-padded: the torch backend's earlier decode path (padded gather, SDPA), kept to measure
BACKENDS = ("torch", "torch-padded", "triton", "flashinfer")
CHOICES = ("auto", *BACKENDS)  # auto: torch on CPU, the best verified one that runs on CUDA
FAST = ("flashinfer", "triton")  # auto's candidates on CUDA, fastest first
# The backends bench/gpu_check.py has passed on a GPU, its result recorded in BENCHMARKS.md.
# Until one is, auto runs the torch reference on CUDA too: an unverified path is never a default.
GPU_VERIFIED: tuple[str, ...] = ()
HALF = (torch.float16, torch.bfloat16)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _triton_reason(dev: str) -> str | None:
    if not _installed("triton"):
        return "attention backend 'triton' needs the triton package (pip install triton)"
    if dev == "cuda" and not torch.cuda.is_available():
        return "attention backend 'triton' was asked for cuda, but no CUDA device is visible"
    if dev == "cpu" and not _interpret():
        return (
            "attention backend 'triton' runs on CPU tensors only under Triton's interpreter: "
            "set TRITON_INTERPRET=1 before starting (slow; for testing), or run on a GPU"
        )
    if dev == "cpu":
        # imported only here: importing triton fixes interpreter or compiler for the process
        from kernels import triton_kernels

        if not triton_kernels.INTERPRETED:
            return (
                "attention backend 'triton': its kernels were compiled for a GPU in this "
                "process (TRITON_INTERPRET=1 was set after they were imported)"
            )
    return None


def _flashinfer_reason(dev: str, dtype: torch.dtype) -> str | None:
    if dev != "cuda" or not torch.cuda.is_available():
        return "attention backend 'flashinfer' needs a CUDA device; use torch (or triton) here"
    if not _installed("flashinfer"):
        return (
            "attention backend 'flashinfer' needs the flashinfer package "
            "(pip install 'attest[gpu]')"
        )
    if dtype not in HALF:
        return (
            f"attention backend 'flashinfer' has no {dtype} kernels; use --dtype bfloat16 "
            "(or the triton or torch backend)"
        )
    return None


def unavailable_reason(
    name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> str | None:
    """Why backend ``name`` cannot run on ``device`` with ``dtype``; None when it can."""
    dev = torch.device(device).type
    if name not in CHOICES:
        return f"attention backend {name!r} is not available; choose one of {CHOICES}"
    if name in ("torch", "torch-padded", "auto"):
        return None
    if dev not in ("cpu", "cuda"):
        return f"attention backend {name!r} runs on cpu or cuda, not {dev}"
    if name == "triton":
        return _triton_reason(dev)
    return _flashinfer_reason(dev, dtype)


class Choice(NamedTuple):
    """The backend that runs, and why it is not the one a reader would expect (or None)."""

    name: str
    note: str | None


def choose_backend(
    name: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    verified: tuple[str, ...] = GPU_VERIFIED,
    runs: Callable[[str, str | torch.device, torch.dtype], str | None] | None = None,
) -> Choice:
    """The concrete backend ``name`` stands for. A named backend is taken as asked. ``auto`` is
    torch on CPU; on CUDA the first of FlashInfer, Triton that ``bench/gpu_check.py`` has
    verified (``verified``) and that can run here (``runs``: ``unavailable_reason``), else torch,
    with a note saying why the faster path was not taken."""
    if name != "auto":
        return Choice(name, None)
    if torch.device(device).type != "cuda":
        return Choice("torch", None)
    runs = runs or unavailable_reason
    for candidate in FAST:
        if candidate in verified and runs(candidate, device, dtype) is None:
            return Choice(candidate, None)
    unverified = [c for c in FAST if c not in verified]
    why = (
        f"{' and '.join(unverified)} not yet verified on a GPU (bench/gpu_check.py)"
        if unverified
        else "no verified backend can run here"
    )
    note = (
        f"attention backend auto chose torch (the reference) on {device}: {why}; "
        f"ask for one with --attention-backend {'|'.join(FAST)}"
    )
    return Choice("torch", note)


def resolve_backend(
    name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> str:
    """The concrete backend ``name`` stands for (``choose_backend`` without the note)."""
    return choose_backend(name, device, dtype).name


def get_backend(
    name: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    page_size: int = 1,
) -> AttentionBackend:
    """The backend named on the command line; a ValueError saying why when it cannot run
    here (raised at boot, before any weight is loaded)."""
    name = resolve_backend(name, device, dtype)
    reason = unavailable_reason(name, device, dtype)
    if reason is not None:
        raise ValueError(reason)
    if name == "triton":
        return TritonBackend()
    if name == "flashinfer":
        return FlashInferBackend(page_size)
    if name == "torch-padded":
        return TorchReferenceBackend(decode="padded")
    return TorchReferenceBackend()
