"""The decode step through the static buffers (``engine.model.graphs``) against the eager step,
on the tiny model: a batch padded up to its bucket gives the real rows the same logits, leaves
every real slot's K/V as the eager step leaves it, and greedy decoding runs the same tokens.
On CPU the static step runs eagerly over the buffers (the torch backend, and the Triton kernels
under Triton's interpreter with their fixed-address plan); on CUDA (``gpu``) each bucket is
captured as a graph and replayed."""

from __future__ import annotations

import pytest
import torch

import tests.triton_interpret  # noqa: F401  (before any triton import: selects the interpreter)
from engine.memory.allocator import TokenAllocator
from engine.memory.kv_pool import KVPool
from engine.memory.req_table import ReqToTokenPool
from engine.model.graphs import DecodeGraphs, build_graphs
from engine.model.llama import LlamaModel
from engine.model.loader import load_model
from engine.model.runner import BatchEntry, ModelRunner
from kernels.select import get_backend, unavailable_reason
from tests.triton_interpret import interpreted_kernels

PROMPTS = [[5, 17, 33, 2, 90], [7] * 9, list(range(40, 53))]  # 3 requests: bucket 4 pads one


class Rig:
    """The tiny model, its pool and request table, and requests prefilled eagerly."""

    def __init__(self, path: str, backend: str, device: str, dtype: torch.dtype, page: int):
        loaded = load_model(path)
        cfg = loaded.config
        attn = get_backend(backend, device, dtype, page)
        self.model = LlamaModel(cfg, loaded.weights, dtype, attn, device)
        self.alloc = TokenAllocator(256, page)
        self.kv = KVPool(
            cfg.num_layers,
            self.alloc.pool_slots,
            cfg.num_kv_heads,
            cfg.head_dim,
            dtype,
            device=device,
        )
        self.table = ReqToTokenPool(8, 128)
        self.eager = ModelRunner(self.model, self.kv, self.table)
        self.rows, self.lens, self.last = [], [], []
        for prompt in PROMPTS:
            row = self.table.alloc()
            slots = self.alloc.alloc_extend(0, len(prompt), None)
            self.table.write(row, 0, slots)
            self.eager.forward([BatchEntry(row, 0, prompt, slots)])
            self.rows.append(row)
            self.lens.append(len(prompt))
            self.last.append(int(slots[-1]))

    def decode_batch(self, tokens: list[int]) -> list[BatchEntry]:
        """One decode token per request, its slot taken and written into the table."""
        batch = []
        for i, (row, held, tok) in enumerate(zip(self.rows, self.lens, tokens)):
            slot = self.alloc.alloc_extend(held, 1, self.last[i])
            self.table.write(row, held, slot)
            batch.append(BatchEntry(row, held, [tok], slot))
            self.lens[i] += 1
            self.last[i] = int(slot[0])
        return batch

    def kv_state(self) -> list[torch.Tensor]:
        return [t.clone() for layer in self.kv.layers for t in (layer.k, layer.v)]

    def restore(self, state: list[torch.Tensor]) -> None:
        for t, saved in zip((t for layer in self.kv.layers for t in (layer.k, layer.v)), state):
            t.copy_(saved)


def _padding_slots(rig: Rig) -> slice:
    return slice(0, rig.alloc.page_size)  # the allocator's padding page


def _compare_one_step(rig: Rig, graphs: DecodeGraphs, atol: float) -> None:
    static = ModelRunner(rig.model, rig.kv, rig.table, graphs)
    batch = rig.decode_batch([11, 12, 13])
    before = rig.kv_state()
    eager_logits = rig.eager.forward(batch)
    eager_kv = rig.kv_state()
    rig.restore(before)
    for layer in rig.kv.layers:  # garbage in the padding page: a real row reading it would show
        layer.k[_padding_slots(rig)] = 1e4
        layer.v[_padding_slots(rig)] = -1e4
    static_logits = static.forward(batch)
    assert static_logits.shape == eager_logits.shape == (3, rig.model.cfg.vocab_size)
    torch.testing.assert_close(static_logits, eager_logits, atol=atol, rtol=0)
    assert static_logits.argmax(-1).tolist() == eager_logits.argmax(-1).tolist()
    real = slice(rig.alloc.page_size, None)
    for got, want in zip(rig.kv_state(), eager_kv):
        torch.testing.assert_close(got[real], want[real], atol=atol, rtol=0)


def _greedy(rig: Rig, runner: ModelRunner, steps: int) -> list[list[int]]:
    tokens, out = [11, 12, 13], []
    for _ in range(steps):
        logits = runner.forward(rig.decode_batch(tokens))
        tokens = logits.argmax(-1).tolist()
        out.append(tokens)
    return out


@pytest.mark.parametrize("page", [1, 4])
def test_a_padded_static_step_gives_the_real_rows_the_eager_logits_and_kv(tiny_model_dir, page):
    rig = Rig(tiny_model_dir, "torch", "cpu", torch.float32, page)
    graphs = DecodeGraphs(rig.model, rig.kv, rig.table, [1, 4, 8])
    assert graphs.buckets[4].decode is None  # the torch backend: lists each step, never captured
    _compare_one_step(rig, graphs, atol=1e-5)


def test_greedy_decoding_through_the_static_step_runs_the_eager_tokens(tiny_model_dir):
    eager = Rig(tiny_model_dir, "torch", "cpu", torch.float32, 1)
    static = Rig(tiny_model_dir, "torch", "cpu", torch.float32, 1)
    graphs = DecodeGraphs(static.model, static.kv, static.table, [2, 4])
    runner = ModelRunner(static.model, static.kv, static.table, graphs)
    assert _greedy(static, runner, 6) == _greedy(eager, eager.eager, 6)


def test_a_batch_past_the_last_bucket_or_a_swapped_model_runs_eagerly(tiny_model_dir):
    rig = Rig(tiny_model_dir, "torch", "cpu", torch.float32, 1)
    graphs = DecodeGraphs(rig.model, rig.kv, rig.table, [1, 2])
    batch = rig.decode_batch([11, 12, 13])
    assert (
        graphs.run([e.row for e in batch], [e.prefix_len for e in batch], [1, 2, 3], [9] * 3)
        is None
    )
    assert graphs.usable(rig.model)
    other = Rig(tiny_model_dir, "torch", "cpu", torch.float32, 1)
    assert not graphs.usable(other.model)


@pytest.mark.skipif(interpreted_kernels() is None, reason="needs Triton's interpreter")
def test_triton_fixed_address_plan_matches_the_eager_step_on_cpu(tiny_model_dir):
    rig = Rig(tiny_model_dir, "triton", "cpu", torch.float32, 1)
    graphs = DecodeGraphs(rig.model, rig.kv, rig.table, [4])
    plan = graphs.buckets[4].decode
    assert plan is not None and plan.key == "triton"
    assert plan.plan.context_lens is graphs.buckets[4].lens  # read from the static buffer
    _compare_one_step(rig, graphs, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_captured_graphs_replay_the_eager_decode_on_cuda(tiny_model_dir, backend):
    """Triton in float32: the greedy tokens of eight steps; FlashInfer (half precision only):
    one padded step's logits within bfloat16's rounding, and the same argmax."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dtype = torch.float32 if backend == "triton" else torch.bfloat16
    if (why := unavailable_reason(backend, "cuda", dtype)) is not None:
        pytest.skip(why)
    page = 16 if backend == "flashinfer" else 1
    static = Rig(tiny_model_dir, backend, "cuda", dtype, page)
    graphs, fields = build_graphs(static.model, static.kv, static.table, [1, 2, 4, 8])
    assert fields["captured"] == [1, 2, 4, 8] and fields["bytes"] >= 0
    assert all(b.graph is not None for b in graphs.buckets.values())
    if backend == "flashinfer":
        _compare_one_step(static, graphs, atol=5e-2)
        return
    eager = Rig(tiny_model_dir, backend, "cuda", dtype, page)
    runner = ModelRunner(static.model, static.kv, static.table, graphs)
    assert _greedy(static, runner, 8) == _greedy(eager, eager.eager, 8)


def test_serve_moves_the_runner_to_new_weights_and_their_graphs(tiny_model_dir):
    old = Rig(tiny_model_dir, "torch", "cpu", torch.float32, 1)
    new = Rig(tiny_model_dir, "torch", "cpu", torch.float32, 1)
    graphs = DecodeGraphs(old.model, old.kv, old.table, [4])
    runner = ModelRunner(old.model, old.kv, old.table, graphs)
    runner.serve(new.model, None)
    assert runner.model is new.model and runner.graphs is None
    fresh = DecodeGraphs(new.model, old.kv, old.table, [4])
    runner.serve(new.model, fresh)
    assert runner.graphs is fresh and fresh.usable(runner.model)


@pytest.mark.gpu
def test_boot_and_a_pool_cutover_capture_and_say_so(tiny_model_dir):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if (why := unavailable_reason("triton", "cuda", torch.float32)) is not None:
        pytest.skip(why)
    from engine import LLM, SamplingParams

    llm = LLM(
        model=tiny_model_dir,
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        kv_tokens=2048,
        max_running=8,
        speculative="off",
    )
    try:
        runs = [r for r in llm.core.receipts.records if r["event"] == "boot.graphs"]
        assert runs[-1]["captured"] == [1, 2, 4, 8] and runs[-1]["bytes"] > 0
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        before = [o.token_ids for o in llm.generate([[5, 6, 7], [9, 10]], [params] * 2)]
        llm.cutover("pool", "carry", kv_tokens=1024)
        runs = [r for r in llm.core.receipts.records if r["event"] == "boot.graphs"]
        assert len(runs) == 2 and llm.core.runner.graphs.usable(llm.core.runner.model)
        after = [o.token_ids for o in llm.generate([[5, 6, 7], [9, 10]], [params] * 2)]
        assert after == before
    finally:
        llm.close()
    eager = LLM(
        model=tiny_model_dir,
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        kv_tokens=2048,
        enforce_eager=True,
    )
    try:
        runs = [r for r in eager.core.receipts.records if r["event"] == "boot.graphs"]
        assert runs[-1]["captured"] == [] and "enforce_eager" in runs[-1]["why"]
        assert eager.core.runner.graphs is None
    finally:
        eager.close()


def test_iteration_receipts_count_static_and_eager_forwards(tiny_model_dir):
    """A runner given decode graphs: each ``iteration`` receipt (one a step here) says how
    many forwards since the last one ran through a bucket's static step and how many eagerly
    (the prefill, and the decodes of a batch past the last bucket); without graphs, neither."""
    from engine import LLM, SamplingParams

    llm = LLM(model=tiny_model_dir, kv_tokens=2048, speculative="off", iteration_receipt_interval=1)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)

    def counted(sizes: list[int] | None, first: int) -> tuple[int, int] | None:
        """One prefill forward of 3 unseen prompts, then 3 decode steps of 3."""
        prompts = [[first, 6, 7], [first, 9], [first, 11, 12]]
        core = llm.core
        if sizes is not None:
            core.runner.serve(core.model, DecodeGraphs(core.model, core.kv, core.req_table, sizes))
        seen = len(core.receipts.records)
        llm.generate(prompts, [params] * 3)
        its = [r for r in list(core.receipts.records)[seen:] if r["event"] == "iteration"]
        if not any("graph_steps" in r for r in its):
            return None
        return sum(r["graph_steps"] for r in its), sum(r["eager_steps"] for r in its)

    try:
        assert counted(None, 100) is None
        assert counted([1, 2, 4], 101) == (3, 1)  # the decodes of 3 pad to bucket 4
        assert counted([1, 2], 102) == (0, 4)  # past the last bucket: eager
    finally:
        llm.close()
