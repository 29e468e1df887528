"""The page table the FlashInfer backend plans with, built without FlashInfer or a GPU."""

from __future__ import annotations

import pytest
import torch

from kernels.flashinfer_backend import page_table
from tests.unit.paged_batch import make_paged_batch


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_page_table_addresses_exactly_each_requests_slots(page_size):
    spec = [(0, 5), (13, 3), (31, 1), (2, 14), (15, 1)]
    b = make_paged_batch(spec, 4, 2, 16, page_size=page_size, seed=page_size)
    qo, kv_ptr, pages, last = page_table(b.meta, page_size)
    assert qo == [0, 5, 8, 9, 23, 24]
    for i, (row, (prefix, ext)) in enumerate(zip(b.meta.req_rows, spec)):
        ctx = prefix + ext
        mine = torch.tensor(pages[kv_ptr[i] : kv_ptr[i + 1]])
        assert len(mine) == -(-ctx // page_size) and 0 not in mine.tolist()  # no padding page
        assert 1 <= last[i] <= page_size
        assert (len(mine) - 1) * page_size + last[i] == ctx
        # FlashInfer's view of the pool: token j at page mine[j // P], offset j % P
        j = torch.arange(ctx)
        assert torch.equal(
            mine[j // page_size] * page_size + j % page_size, b.meta.req_to_token[row, :ctx]
        )
