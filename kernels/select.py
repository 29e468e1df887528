"""Which attention backend runs: ``auto`` resolved for the device, and a clear reason, raised at
boot, when the one asked for cannot run here.

It sits above the interface and the backends (each imports ``kernels.attention``), so the
imports among the kernels run one way.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from kernels.attention import AttentionBackend
from kernels.flashinfer_backend import FlashInferBackend
from kernels.torch_ref import TorchReferenceBackend
from kernels.triton_backend import TritonBackend

BACKENDS = ("torch", "triton", "flashinfer")
CHOICES = ("auto", *BACKENDS)  # auto: torch on CPU, the best one that can run on CUDA
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
    if name in ("torch", "auto"):
        return None
    if dev not in ("cpu", "cuda"):
        return f"attention backend {name!r} runs on cpu or cuda, not {dev}"
    if name == "triton":
        return _triton_reason(dev)
    return _flashinfer_reason(dev, dtype)


def resolve_backend(
    name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> str:
    """The concrete backend ``name`` stands for: ``auto`` is torch on CPU; on CUDA FlashInfer
    when it can run, else Triton when installed, else torch."""
    if name != "auto":
        return name
    if torch.device(device).type != "cuda":
        return "torch"
    for candidate in ("flashinfer", "triton"):
        if unavailable_reason(candidate, device, dtype) is None:
            return candidate
    return "torch"


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
    return TorchReferenceBackend()
