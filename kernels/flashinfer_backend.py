"""The FlashInfer attention backend (CUDA only, half precision only).

FlashInfer reads a paged cache ``[pages, page_size, kv_heads, head_dim]`` ("NHD") through a
per-request list of page ids. Our pool is ``[slots, kv_heads, head_dim]`` with slot
``page * page_size + offset``, and the allocator keeps token ``j`` of a request at offset
``j % page_size`` of its ``j // page_size``-th page, so the pool *is* that cache (a view, no
copy) and a request's pages are the slots of its tokens ``0, page_size, 2 * page_size, ...``
divided by the page size.

``flashinfer`` is imported only when this backend is built: the package installs on CPU machines
but none of its kernels runs there (it lives in the ``gpu`` extra).
"""

from __future__ import annotations

import torch

from kernels.attention import AttentionBackend, AttentionMetadata, GraphDecode, LayerKV, store_kv

WORKSPACE_BYTES = 128 * 1024 * 1024


def page_table(
    meta: AttentionMetadata, page_size: int
) -> tuple[list[int], list[int], list[int], list[int]]:
    """(qo_indptr, kv_indptr, kv_page_ids, kv_last_page_len) of a batch, as plain lists: the
    CSR page table FlashInfer plans with. Pure, so it is tested without a GPU."""
    qo, kv_ptr, pages, last = [0], [0], [], []
    for row, prefix, ext in zip(meta.req_rows, meta.prefix_lens, meta.extend_lens):
        ctx = prefix + ext
        first_slots = meta.req_to_token[row, :ctx:page_size]
        pages.extend((first_slots // page_size).tolist())
        qo.append(qo[-1] + ext)
        kv_ptr.append(len(pages))
        last.append((ctx - 1) % page_size + 1)
    return qo, kv_ptr, pages, last


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, page_size: int) -> None:
        import flashinfer

        self.fi = flashinfer
        self.page_size = page_size
        self._wrappers: dict[str, object] = {}

    def _wrapper(self, kind: str, device: torch.device):
        w = self._wrappers.get(kind)
        if w is None:
            if "workspace" not in self._wrappers:
                self._wrappers["workspace"] = torch.empty(
                    WORKSPACE_BYTES, dtype=torch.uint8, device=device
                )
            ws = self._wrappers["workspace"]
            if kind == "decode":
                w = self.fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
            else:
                w = self.fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
            self._wrappers[kind] = w
        return w

    def graph_decode(
        self,
        rows: int,
        width: int,
        heads: int,
        kv: LayerKV,
        scale: float,
        q_dtype: torch.dtype,
        context_lens: torch.Tensor,
    ) -> GraphDecode:
        """A decode wrapper of its own for ``rows`` requests, made for CUDA graphs: its page
        table lives in fixed buffers (room for every request's ``width`` tokens), and planning
        a step (``update``, on the host before each replay) writes into them. The workspace is
        shared with the other wrappers: one step runs at a time, planned just before."""
        dev = context_lens.device
        self._wrapper("decode", dev)  # makes the shared workspace
        pages_each = -(-width // self.page_size)
        indptr = torch.zeros(rows + 1, dtype=torch.int32, device=dev)
        pages = torch.zeros(rows * pages_each, dtype=torch.int32, device=dev)
        last = torch.ones(rows, dtype=torch.int32, device=dev)
        w = self.fi.BatchDecodeWithPagedKVCacheWrapper(
            self._wrappers["workspace"],
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=pages,
            paged_kv_last_page_len_buffer=last,
        )
        kv_heads, head_dim = kv.k.shape[1], kv.k.shape[2]

        def update(meta: AttentionMetadata) -> None:
            _, kv_ptr, ids, lasts = page_table(meta, self.page_size)
            w.plan(
                torch.tensor(kv_ptr, dtype=torch.int32),
                torch.tensor(ids, dtype=torch.int32),
                torch.tensor(lasts, dtype=torch.int32),
                heads,
                kv_heads,
                head_dim,
                self.page_size,
                pos_encoding_mode="NONE",
                q_data_type=q_dtype,
                kv_data_type=kv.k.dtype,
                sm_scale=scale,
            )

        return GraphDecode("flashinfer", w, update)

    def _plan(self, meta: AttentionMetadata, q: torch.Tensor, kv: LayerKV, scale: float):
        planned = meta.scratch.get("flashinfer")
        if planned is not None:
            return planned
        dev = q.device
        qo, kv_ptr, pages, last = page_table(meta, self.page_size)

        def i32(xs: list[int]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.int32, device=dev)

        heads, kv_heads, head_dim = q.shape[1], kv.k.shape[1], kv.k.shape[2]
        if meta.is_decode:
            w = self._wrapper("decode", dev)
            w.plan(
                i32(kv_ptr),
                i32(pages),
                i32(last),
                heads,
                kv_heads,
                head_dim,
                self.page_size,
                pos_encoding_mode="NONE",
                q_data_type=q.dtype,
                kv_data_type=kv.k.dtype,
                sm_scale=scale,
            )
        else:
            w = self._wrapper("prefill", dev)
            w.plan(
                i32(qo),
                i32(kv_ptr),
                i32(pages),
                i32(last),
                heads,
                kv_heads,
                head_dim,
                self.page_size,
                causal=True,
                pos_encoding_mode="NONE",
                sm_scale=scale,
                q_data_type=q.dtype,
                kv_data_type=kv.k.dtype,
            )
        meta.scratch["flashinfer"] = w
        return w

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv: LayerKV,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        store_kv(k, v, kv, meta.out_slots)
        w = self._plan(meta, q, kv, scale)
        slots, kv_heads, head_dim = kv.k.shape
        shape = (slots // self.page_size, self.page_size, kv_heads, head_dim)
        # causal=True aligns the queries to the end of each request's context: query j of an
        # extend sees the prefix and new tokens 0..=j, which is exactly the extend rule
        return w.run(q.contiguous(), (kv.k.view(shape), kv.v.view(shape)))
