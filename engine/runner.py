"""ModelRunner: one forward over a flat batch -> the logits of each request's last token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.mem.kv_pool import KVPool
from engine.mem.req_table import ReqToTokenPool
from engine.model.llama import LlamaModel
from kernels.attention import AttentionMetadata


@dataclass(slots=True)
class BatchEntry:
    row: int
    prefix_len: int  # tokens already in the pool
    token_ids: list[int]  # new tokens, at positions [prefix_len, prefix_len + len)
    out_slots: torch.Tensor  # where their K/V go (already written into the req table row)


class ModelRunner:
    def __init__(self, model: LlamaModel, kv: KVPool, req_table: ReqToTokenPool) -> None:
        self.model = model
        self.kv = kv
        self.req_table = req_table
        self.device = model.device

    def forward(
        self, batch: list[BatchEntry], all_positions: bool = False, every: list[bool] | None = None
    ) -> torch.Tensor:
        """Logits (fp32) at the last new token of each entry: [len(batch), vocab]; with
        ``all_positions``, at every new token: [sum of lengths, vocab]; with ``every``, at every
        new token of the entries it marks and the last of the others, in batch order."""
        ids: list[int] = []
        pos: list[int] = []
        last: list[int] = []
        for j, e in enumerate(batch):
            start = len(ids)
            ids.extend(e.token_ids)
            pos.extend(range(e.prefix_len, e.prefix_len + len(e.token_ids)))
            last.extend(range(start, len(ids)) if every and every[j] else [len(ids) - 1])
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
        ids_t = torch.tensor(ids, dtype=torch.int64, device=dev)
        hidden = self.model.forward(ids_t, meta, self.kv.layers)
        if not all_positions:
            hidden = hidden[torch.tensor(last, dtype=torch.int64, device=dev)]
        logits = self.model.logits(hidden)
        return logits if dev.type == "cpu" else logits.cpu()  # the sampler runs on the host
