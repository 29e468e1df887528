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

    def forward(self, batch: list[BatchEntry], all_positions: bool = False) -> torch.Tensor:
        """Logits (fp32) at the last new token of each entry: [len(batch), vocab]; with
        ``all_positions``, at every new token: [sum of lengths, vocab]."""
        ids: list[int] = []
        pos: list[int] = []
        last: list[int] = []
        for e in batch:
            ids.extend(e.token_ids)
            pos.extend(range(e.prefix_len, e.prefix_len + len(e.token_ids)))
            last.append(len(ids) - 1)
        meta = AttentionMetadata(
            req_to_token=self.req_table.table,
            req_rows=[e.row for e in batch],
            prefix_lens=[e.prefix_len for e in batch],
            extend_lens=[len(e.token_ids) for e in batch],
            positions=torch.tensor(pos, dtype=torch.int64),
            out_slots=torch.cat([e.out_slots for e in batch]),
        )
        meta.validate()
        hidden = self.model.forward(torch.tensor(ids, dtype=torch.int64), meta, self.kv.layers)
        if all_positions:
            return self.model.logits(hidden)
        return self.model.logits(hidden[torch.tensor(last, dtype=torch.int64)])
