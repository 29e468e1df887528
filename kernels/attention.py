"""The attention interface every backend implements.

A forward pass runs a *flat* batch: the new tokens of every request laid end to end. For request
``i`` the batch holds ``extend_lens[i]`` new tokens at positions ``[prefix_lens[i],
prefix_lens[i] + extend_lens[i])``; its whole context (cached prefix then new tokens) lives in the
KV pool at the slots ``req_to_token[req_rows[i], :prefix_lens[i] + extend_lens[i]]``.

* extend: new tokens attend causally to themselves and fully to their cached prefix.
* decode: the special case ``extend_lens == 1`` for every request.

Backends first store the new tokens' K/V into ``out_slots`` of the layer's pool, then attend by
reading K/V through the slot table, so a prefix computed by an earlier forward (or another
request, through the prefix cache) is read, never recomputed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Per-batch metadata, built once per forward and shared by every layer."""

    req_to_token: torch.Tensor  # [rows, max_context] int64: slot of each token of each row
    req_rows: list[int]  # the req_to_token row of each request in the batch
    prefix_lens: list[int]  # tokens already in the pool before this forward, per request
    extend_lens: list[int]  # new tokens in this forward, per request
    positions: torch.Tensor  # [T] int64, position of each new token
    out_slots: torch.Tensor  # [T] int64, the pool slot each new token's K/V is written to
    # what a backend derives once per forward and reuses in every layer (index tables, masks)
    scratch: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.extend_lens)

    def validate(self) -> None:
        """Catch a malformed batch before a kernel reads out of bounds."""
        n = len(self.req_rows)
        if not (len(self.prefix_lens) == len(self.extend_lens) == n):
            raise ValueError(
                "req_rows, prefix_lens and extend_lens must have one entry per request"
            )
        total = sum(self.extend_lens)
        if total != self.num_tokens or total != int(self.out_slots.shape[0]):
            raise ValueError(
                f"extend_lens sum to {total} but positions has {self.num_tokens} "
                f"and out_slots {int(self.out_slots.shape[0])} tokens"
            )
        width = int(self.req_to_token.shape[1])
        for p, e in zip(self.prefix_lens, self.extend_lens):
            if p < 0 or e < 1 or p + e > width:
                raise ValueError(f"request context {p}+{e} outside the slot table width {width}")


@dataclass(slots=True)
class LayerKV:
    """One layer's K and V pools: ``[slots, kv_heads, head_dim]`` each."""

    k: torch.Tensor
    v: torch.Tensor


class AttentionBackend(ABC):
    """Computes attention for a flat batch over a paged KV pool.

    Invariant: after ``forward`` returns, ``kv.k[out_slots]``/``kv.v[out_slots]`` hold the new
    tokens' K/V, and the output for every new token depends only on the K/V of its own request's
    slots at positions ``<=`` its own.
    """

    name: str = "abstract"

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, heads, head_dim]
        k: torch.Tensor,  # [T, kv_heads, head_dim]
        v: torch.Tensor,  # [T, kv_heads, head_dim]
        kv: LayerKV,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, heads, head_dim]
        ...


def store_kv(k: torch.Tensor, v: torch.Tensor, kv: LayerKV, out_slots: torch.Tensor) -> None:
    kv.k.index_copy_(0, out_slots, k.to(kv.k.dtype))
    kv.v.index_copy_(0, out_slots, v.to(kv.v.dtype))


BACKENDS = ("torch", "triton", "flashinfer")
CHOICES = ("auto", *BACKENDS)  # auto: torch on CPU, the best one that can run on CUDA
HALF = (torch.float16, torch.bfloat16)


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _interpret() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


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
            from kernels import triton_kernels

            if not triton_kernels.INTERPRETED:
                return (
                    "attention backend 'triton': its kernels were compiled for a GPU in this "
                    "process (TRITON_INTERPRET=1 was set after they were imported)"
                )
        return None
    # flashinfer
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
        from kernels.triton_backend import TritonBackend

        return TritonBackend()
    if name == "flashinfer":
        from kernels.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(page_size)
    from kernels.torch_ref import TorchReferenceBackend

    return TorchReferenceBackend()
