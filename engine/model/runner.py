"""ModelRunner: one forward over a flat batch -> the logits of each request's last token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.memory.kv_pool import KVPool
from engine.memory.req_table import ReqToTokenPool
from engine.model.graphs import DecodeGraphs
from engine.model.llama import LlamaModel
from kernels.attention import AttentionMetadata


@dataclass(slots=True)
class BatchEntry:
    row: int
    prefix_len: int  # tokens already in the pool
    token_ids: list[int]  # new tokens, at positions [prefix_len, prefix_len + len)
    out_slots: torch.Tensor  # where their K/V go (already written into the req table row)


@dataclass(slots=True)
class StepCounts:
    """Forwards since the last ``take``: through a bucket's static step (a replayed graph on a
    GPU) and eagerly (a prefill chunk, drafts to verify, a batch past the last bucket)."""

    graph: int = 0
    eager: int = 0

    def take(self) -> tuple[int, int]:
        taken = (self.graph, self.eager)
        self.graph = self.eager = 0
        return taken


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv: KVPool,
        req_table: ReqToTokenPool,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model = model
        self.kv = kv
        self.req_table = req_table
        self.device = model.device
        # decode steps over static buffers, on a GPU replayed as CUDA graphs (engine.model.graphs)
        self.graphs = graphs
        self.steps = StepCounts()  # which way the forwards ran, for the iteration receipt

    def serve(self, model: LlamaModel, graphs: DecodeGraphs | None) -> None:
        """Run ``model`` from the next forward on, its decode steps through ``graphs`` (a
        cutover's new weights, layout or pool; None drops the old graphs, their memory with
        them, before new ones are captured)."""
        self.model, self.device, self.graphs = model, model.device, graphs

    def forward(
        self, batch: list[BatchEntry], all_positions: bool = False, every: list[bool] | None = None
    ) -> torch.Tensor:
        """Logits (fp32) at the last new token of each entry: [len(batch), vocab]; with
        ``all_positions``, at every new token: [sum of lengths, vocab]; with ``every``, at every
        new token of the entries it marks and the last of the others, in batch order. With
        pipeline stages the batch goes through them as micro-batches (``micro_batches``)."""
        if self.graphs is not None and all(len(e.token_ids) == 1 for e in batch):
            out = self._decode_static(batch, self.graphs)
            if out is not None:  # a decode step its bucket held
                self.steps.graph += 1
                return out
        if self.graphs is not None:  # counted only where graphs could have run
            self.steps.eager += 1
        dev, stage = self.device, self.model.stage
        hidden, last = [], []
        for part in micro_batches(batch, stage.count):
            at = sum(h.shape[0] for h in hidden)
            ids, meta, picks = self._inputs(
                [batch[j] for j in part], [bool(every and every[j]) for j in part]
            )
            hidden.append(self.model.forward(ids, meta, self.kv.layers))
            last.extend(at + i for i in picks)
        stage.drain()
        x = hidden[0] if len(hidden) == 1 else torch.cat(hidden)
        if not all_positions:
            x = x[torch.tensor(last, dtype=torch.int64, device=dev)]
        logits = self.model.logits(x)
        return logits if dev.type == "cpu" else logits.cpu()  # the sampler runs on the host

    def _decode_static(self, batch: list[BatchEntry], graphs: DecodeGraphs) -> torch.Tensor | None:
        """A decode step through the static buffers (a graph replayed on a GPU): the logits of
        each entry's token, or None where no bucket holds the batch or the graphs belong to
        weights or a pool no longer running (a cutover's): the step then runs eagerly."""
        if not graphs.usable(self.model):
            return None
        return graphs.run(
            [e.row for e in batch],
            [e.prefix_len for e in batch],
            [e.token_ids[0] for e in batch],
            torch.cat([e.out_slots for e in batch]),
        )

    def _inputs(
        self, batch: list[BatchEntry], every: list[bool]
    ) -> tuple[torch.Tensor, AttentionMetadata, list[int]]:
        """The token ids, the attention metadata and the rows to take logits at (each entry's
        last new token, or every new token of an entry ``every`` marks) of ``batch``."""
        ids: list[int] = []
        pos: list[int] = []
        last: list[int] = []
        for e, all_rows in zip(batch, every):
            start = len(ids)
            ids.extend(e.token_ids)
            pos.extend(range(e.prefix_len, e.prefix_len + len(e.token_ids)))
            last.extend(range(start, len(ids)) if all_rows else [len(ids) - 1])
        table, rows = self.req_table.table, [e.row for e in batch]
        dev = self.device
        if dev.type != "cpu":
            # the slot table lives with the scheduler on the host: ship only this batch's rows
            width = max(e.prefix_len + len(e.token_ids) for e in batch)
            table = table[torch.tensor(rows), :width].to(dev, non_blocking=True)
            rows = list(range(len(batch)))
        meta = AttentionMetadata(
            req_to_token=table,
            req_rows=rows,
            prefix_lens=[e.prefix_len for e in batch],
            extend_lens=[len(e.token_ids) for e in batch],
            positions=torch.tensor(pos, dtype=torch.int64, device=dev),
            out_slots=torch.cat([e.out_slots for e in batch]).to(dev),
        )
        meta.validate()
        return torch.tensor(ids, dtype=torch.int64, device=dev), meta, last


def micro_batches(batch: list[BatchEntry], stages: int) -> list[range]:
    """``batch`` cut into as many runs of entries as there are stages (fewer when it has fewer
    entries), of about equal tokens, so each stage works on one while the next takes the one
    before; one stage takes the batch whole."""
    n = min(stages, len(batch))
    if n <= 1:
        return [range(len(batch))]
    total = sum(len(e.token_ids) for e in batch)
    cuts, acc, j = [0], 0, 0
    for j, e in enumerate(batch):
        acc += len(e.token_ids)
        # close a run once it holds its share, leaving an entry for each run still to come
        if len(cuts) < n and acc * n >= total * len(cuts) and len(batch) - (j + 1) >= n - len(cuts):
            cuts.append(j + 1)
    cuts.append(len(batch))
    return [range(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]
