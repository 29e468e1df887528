"""Decode steps at fixed addresses: the batch-size buckets, the static input buffers, and on a
GPU one CUDA graph per bucket, captured at boot and replayed each step.

A decode step's host work (a Python call chain per layer, a launch per op) costs more than the
GPU's work on a small model; a captured graph replays the whole launch chain at once. A graph
reads and writes fixed addresses, so the step's inputs (token ids, positions, the KV slot each
token's K/V goes to, each request's context length and slot table row) are copied into static
buffers sized for the bucket, and the attention backend's decode plan is built over them once
(``AttentionBackend.graph_decode``). A batch is padded up to its bucket: a padded row is token
0 at position 0, its K/V written to slot 0 (the allocator's padding page, never handed out),
its context that one slot; its logits are dropped. Real rows never read slot 0, so padding
cannot disturb them.

It lives with the model (beside ``ModelRunner``, which runs it) because it holds the model's
forward, and it decides nothing about scheduling: which batch runs is the scheduler's.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.memory.kv_pool import KVPool
from engine.memory.req_table import ReqToTokenPool
from engine.model.llama import LlamaModel
from kernels.attention import AttentionMetadata, GraphDecode

PAD_SLOT = 0  # the allocator's padding page starts here: written by padded rows, read by none
# rows of the static inputs block
IDS, POSITIONS, SLOTS, LENS = range(4)


def capture_sizes(max_batch: int) -> list[int]:
    """The buckets for batches of up to ``max_batch`` requests: 1, 2, 4, 8, 16, then 8 more a
    step up to 32 and 16 more a step beyond (a batch pads to less than twice itself, and past 16
    by at most half of itself), and ``max_batch`` itself."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes, n = [], 1
    while n <= max_batch and n < 16:
        sizes.append(n)
        n *= 2
    n = 16
    while n <= max_batch:
        sizes.append(n)
        n += 8 if n < 32 else 16
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


def bucket_for(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest bucket of ``sizes`` (ascending) that holds ``n`` rows; None past the last."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if n >= 1 and i < len(sizes) else None


def graphs_off(
    device: str, enforce_eager: bool, world: int, stages: int, backend: str
) -> str | None:
    """Why decode steps are not captured as CUDA graphs (None: they are). A CPU has none; a
    group's collectives and a pipeline's sends are not captured here; the torch reference
    backend sizes its decode from Python lists each step, so it has no fixed-address plan."""
    if torch.device(device).type != "cuda":
        return f"device {device}: CUDA graphs need a CUDA device"
    if enforce_eager:
        return "enforce_eager: every step runs eagerly"
    if world > 1 or stages > 1:
        return f"{world} ranks, {stages} stages: a group's step is not captured"
    if backend.startswith("torch"):
        return f"attention backend {backend} has no fixed-address decode (triton, flashinfer do)"
    return None


def decode_block(
    tokens: Sequence[int],
    prefix_lens: Sequence[int],
    slots: Sequence[int] | torch.Tensor,
    size: int,
) -> torch.Tensor:
    """The step's inputs for ``size`` rows as one int64 ``[4, size]`` block (one copy to the
    device): token ids, positions, KV slots, context lengths; the rows past the batch padded
    (token 0 at position 0, slot ``PAD_SLOT``, a context of that one slot)."""
    n = len(tokens)
    if not (n == len(prefix_lens) == len(slots)) or n > size:
        raise ValueError(f"{n} tokens, {len(prefix_lens)} lengths, {len(slots)} slots for {size}")
    block = torch.zeros(4, size, dtype=torch.int64)
    block[IDS, :n] = torch.as_tensor(tokens, dtype=torch.int64)
    block[POSITIONS, :n] = torch.as_tensor(prefix_lens, dtype=torch.int64)
    block[SLOTS, :n] = torch.as_tensor(slots, dtype=torch.int64)
    block[SLOTS, n:] = PAD_SLOT
    block[LENS] = block[POSITIONS] + 1
    return block


@dataclass(slots=True)
class Bucket:
    """One bucket's views of the static buffers, its backend plan (None: the backend plans
    each step from Python lists, so it runs eagerly) and on a GPU its graph and output."""

    size: int
    ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    lens: torch.Tensor
    table: torch.Tensor
    decode: GraphDecode | None
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # the graph's output, [size, vocab]


@dataclass(frozen=True, slots=True)
class Captured:
    """What capture did at boot: the buckets captured, the device memory they took, the
    seconds it took (the ``boot.graphs`` receipt)."""

    sizes: list[int]
    bytes: int
    seconds: float


class DecodeGraphs:
    """The decode step over static buffers for each bucket of ``sizes``; ``capture`` records
    each bucket's step as a CUDA graph (a GPU, and a backend with a fixed-address plan), else
    ``run`` calls the same step eagerly over the same buffers (what the CPU tests drive)."""

    def __init__(
        self, model: LlamaModel, kv: KVPool, req_table: ReqToTokenPool, sizes: Sequence[int]
    ) -> None:
        self.model, self.kv, self.req_table = model, kv, req_table
        self.sizes = sorted(set(sizes))
        self.k0 = kv.layers[0].k  # the pool the graphs write; a re-homed pool ends them
        dev, top = model.device, self.sizes[-1]
        self.width = req_table.table.shape[1]
        self.inputs = torch.zeros(4, top, dtype=torch.int64, device=dev)
        self.inputs[LENS] = 1
        self.table = torch.zeros(top, self.width, dtype=torch.int64, device=dev)
        self.buckets = {n: self._bucket(n) for n in self.sizes}
        self.pool: object | None = None  # the graphs' shared memory pool, once captured

    def _bucket(self, n: int) -> Bucket:
        x, model = self.inputs, self.model
        lens, table = x[LENS, :n], self.table[:n]
        layer = self.kv.layers[0]
        decode = model.backend.graph_decode(
            n, self.width, model.local_heads, layer, model.scale, model.dtype, lens
        )
        return Bucket(n, x[IDS, :n], x[POSITIONS, :n], x[SLOTS, :n], lens, table, decode)

    def usable(self, model: LlamaModel) -> bool:
        """Whether the buffers and graphs still belong to the running model and pool (a
        weights cutover or a re-homed pool leaves them behind: the step runs eagerly)."""
        return model is self.model and self.kv.layers[0].k is self.k0

    def _meta(self, b: Bucket, prefix_lens: list[int]) -> AttentionMetadata:
        """The metadata over ``b``'s buffers; with a fixed-address plan, that plan in its
        scratch (the lists then only describe the batch: the kernels read the buffers)."""
        meta = AttentionMetadata(
            req_to_token=b.table,
            req_rows=list(range(b.size)),
            prefix_lens=prefix_lens,
            extend_lens=[1] * b.size,
            positions=b.positions,
            out_slots=b.slots,
        )
        if b.decode is not None:
            meta.scratch[b.decode.key] = b.decode.plan
        return meta

    def _step(self, b: Bucket, prefix_lens: list[int]) -> torch.Tensor:
        """One decode forward over ``b``'s buffers: ``[size, vocab]`` fp32 logits."""
        meta = self._meta(b, prefix_lens)
        hidden = self.model.forward(b.ids, meta, self.kv.layers)
        return self.model.logits(hidden)

    def run(
        self,
        rows: list[int],
        prefix_lens: list[int],
        tokens: list[int],
        slots: Sequence[int] | torch.Tensor,
    ) -> torch.Tensor | None:
        """One decode token for each request (its req-table row, tokens already in the pool,
        its new token and the slot its K/V goes to): the logits ``[n, vocab]`` on the host,
        or None where no bucket holds ``n`` requests."""
        n = len(rows)
        size = bucket_for(n, self.sizes)
        if size is None:
            return None
        b = self.buckets[size]
        width = max(prefix_lens) + 1
        host = torch.zeros(size, width, dtype=torch.int64)  # padded rows: slot 0 first
        host[:n] = self.req_table.table[rows, :width]
        block = decode_block(tokens, prefix_lens, slots, size)
        self.inputs[:, :size].copy_(block, non_blocking=True)
        b.table[:, :width].copy_(host, non_blocking=True)
        padded = prefix_lens + [0] * (size - n)
        if b.decode is not None and b.decode.update is not None:
            b.decode.update(self._host_meta(b, host, padded, block))
        if b.graph is not None:
            b.graph.replay()
            logits = b.logits
        else:
            logits = self._step(b, padded)
        assert logits is not None
        out = logits[:n]
        return out if out.device.type == "cpu" else out.cpu()

    @staticmethod
    def _host_meta(
        b: Bucket, host: torch.Tensor, padded: list[int], block: torch.Tensor
    ) -> AttentionMetadata:
        """The step's metadata on the host, for a backend's own planning (``update``)."""
        return AttentionMetadata(
            req_to_token=host,
            req_rows=list(range(b.size)),
            prefix_lens=padded,
            extend_lens=[1] * b.size,
            positions=block[POSITIONS],
            out_slots=block[SLOTS],
        )

    def capture(self) -> Captured:
        """Each bucket's step recorded as a CUDA graph, the largest first (the smaller ones
        reuse its memory from the shared pool), each warmed up eagerly first (kernels compile,
        libraries make their handles) on a padding-only batch, which writes slot 0 alone."""
        t0 = time.perf_counter()
        free0 = torch.cuda.mem_get_info(self.model.device)[0]
        self.pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            b = self.buckets[size]
            if b.decode is None:
                continue
            padded = [0] * size
            self.inputs[:, :size].copy_(decode_block([], [], [], size))
            if b.decode.update is not None:
                host = torch.zeros(size, 1, dtype=torch.int64)
                b.decode.update(self._host_meta(b, host, padded, decode_block([], [], [], size)))
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step(b, padded)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                b.logits = self._step(b, padded)
            b.graph = graph
        torch.cuda.synchronize()
        took = max(0, free0 - torch.cuda.mem_get_info(self.model.device)[0])
        done = [n for n in self.sizes if self.buckets[n].graph is not None]
        return Captured(done, took, time.perf_counter() - t0)


def build_graphs(
    model: LlamaModel, kv: KVPool, req_table: ReqToTokenPool, sizes: Sequence[int]
) -> tuple[DecodeGraphs, dict[str, object]]:
    """The decode graphs for ``sizes``, captured, and the ``boot.graphs`` receipt's fields:
    the buckets captured, the device memory the buffers and graphs took, the seconds."""
    dev = model.device
    free0 = torch.cuda.mem_get_info(dev)[0]
    graphs = DecodeGraphs(model, kv, req_table, sizes)
    done = graphs.capture()
    took = max(0, free0 - torch.cuda.mem_get_info(dev)[0])
    return graphs, {
        "captured": done.sizes,
        "bytes": took,
        "graph_bytes": done.bytes,
        "seconds": round(done.seconds, 3),
        "width": graphs.width,
        "backend": model.backend.name,
    }


def capture_or_eager(
    build: Callable[[], tuple[DecodeGraphs, dict[str, object]]],
) -> tuple[DecodeGraphs | None, dict[str, object]]:
    """``build``'s graphs and ``boot.graphs`` fields; a capture that raises (out of device
    memory, a kernel that cannot be captured) leaves every step eager and says why, so a
    faster path that fails never stops a boot the eager step can serve."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - any failure of capture: the eager step serves
        return None, {"captured": [], "why": f"capture failed: {type(e).__name__}: {e}"[:500]}
