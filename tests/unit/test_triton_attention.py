"""The Triton kernels against the torch reference, run by Triton's interpreter on CPU tensors.

Every output buffer starts as NaN, so an element a kernel forgets to write fails the comparison;
every pool slot outside the batch's contexts is NaN too, so a read outside a request's own slots
does as well.
"""

from __future__ import annotations

import math

import pytest
import torch

import tests.triton_interpret  # noqa: F401  (before any triton import: selects the interpreter)
from kernels.attention import LayerKV
from kernels.select import get_backend
from kernels.torch_ref import TorchReferenceBackend
from tests.triton_interpret import interpreted_kernels
from tests.unit.paged_batch import PagedBatch, make_paged_batch, random_spec

TOL = {torch.float32: {"atol": 2e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@pytest.fixture(scope="module")
def tk():
    pytest.importorskip("triton")
    mod = interpreted_kernels()
    if mod is None:
        pytest.skip("triton was loaded without its interpreter in this process")
    return mod


def poison_unused(b: PagedBatch) -> None:
    unused = b.unused_slots()
    b.kv.k[unused] = float("nan")
    b.kv.v[unused] = float("nan")


def reference(b: PagedBatch) -> tuple[torch.Tensor, LayerKV]:
    """The torch backend on a copy of the pool (before poisoning): output, pool after."""
    pool = b.pool_copy()
    out = TorchReferenceBackend().forward(b.q, b.k, b.v, pool, b.meta, b.scale)
    return out, pool


def index_args(b: PagedBatch):
    m = b.meta
    rows = torch.tensor(m.req_rows, dtype=torch.int64)
    prefix = torch.tensor(m.prefix_lens, dtype=torch.int32)
    ext = torch.tensor(m.extend_lens, dtype=torch.int32)
    start = (torch.cumsum(ext, 0) - ext).to(torch.int32)
    return rows, prefix, ext, start


def run_extend(
    tk, b: PagedBatch, scale: float | None = None, block: int = 16, max_extend: int | None = None
) -> torch.Tensor:
    rows, prefix, ext, start = index_args(b)
    out = torch.full_like(b.q, float("nan"))
    tk.store_kv(b.k, b.v, b.kv.k, b.kv.v, b.meta.out_slots)
    tk.extend_attention(
        b.q,
        b.kv.k,
        b.kv.v,
        b.meta.req_to_token,
        rows,
        prefix,
        ext,
        start,
        max_extend or max(b.meta.extend_lens),
        b.scale if scale is None else scale,
        out=out,
        block_m=block,
        block_n=block,
    )
    return out


def run_decode(tk, b: PagedBatch, splits: int, scale: float | None = None) -> torch.Tensor:
    rows, prefix, _, _ = index_args(b)
    bsz, heads, d = b.q.shape
    out = torch.full_like(b.q, float("nan"))
    part_o = torch.full((bsz, heads, splits, d), float("nan"))
    part_lse = torch.full((bsz, heads, splits), float("nan"))
    tk.store_kv(b.k, b.v, b.kv.k, b.kv.v, b.meta.out_slots)
    tk.decode_attention(
        b.q,
        b.kv.k,
        b.kv.v,
        b.meta.req_to_token,
        rows,
        prefix + 1,
        b.scale if scale is None else scale,
        splits,
        out=out,
        part_o=part_o,
        part_lse=part_lse,
        block_n=16,
    )
    return out


def check_extend(tk, b: PagedBatch) -> None:
    want, pool = reference(b)
    poison_unused(b)
    got = run_extend(tk, b)
    torch.testing.assert_close(got, want, **TOL[b.q.dtype])
    used = b.context_slots
    assert torch.equal(b.kv.k[used], pool.k[used]) and torch.equal(b.kv.v[used], pool.v[used])


def check_decode(tk, b: PagedBatch, splits: int) -> None:
    want, _ = reference(b)
    poison_unused(b)
    torch.testing.assert_close(run_decode(tk, b, splits), want, **TOL[b.q.dtype])


# -- the interpreter really runs them ---------------------------------------------------------


def test_kernels_run_under_the_interpreter_on_cpu_tensors(tk):
    from triton.runtime.interpreter import InterpretedFunction

    assert tk.INTERPRETED
    for kernel in (tk._store_kv_kernel, tk._decode_split_kernel, tk._extend_kernel):
        assert isinstance(kernel, InterpretedFunction)
    b = make_paged_batch([(3, 1)], 2, 2, 16)
    assert b.q.device.type == "cpu"
    assert not torch.isnan(run_decode(tk, b, splits=2)).any()  # it wrote every element


# -- store ------------------------------------------------------------------------------------


@DTYPES
@pytest.mark.parametrize("page_size", [1, 16])
def test_store_kv_writes_exactly_the_new_slots(tk, dtype, page_size):
    b = make_paged_batch([(0, 5), (17, 3), (2, 1)], 4, 2, 16, dtype, page_size, seed=page_size)
    # the new keys as the model produces them: a strided view into a fused projection
    fused = torch.randn(b.meta.num_tokens, 3, 2, 16).to(dtype)
    fused[:, 1] = b.k
    k_view = fused[:, 1]
    assert not k_view.is_contiguous()
    # the values as a float32 GEMM computed transposed returns them: head_dim not unit-stride
    t = b.meta.num_tokens
    v_view = b.v.reshape(t, -1).t().contiguous().t().view(t, 2, 16)
    assert v_view.stride(-1) != 1 and torch.equal(v_view, b.v)
    before = b.pool_copy()
    b.kv.k[b.meta.out_slots] = float("nan")
    b.kv.v[b.meta.out_slots] = float("nan")
    tk.store_kv(k_view, v_view, b.kv.k, b.kv.v, b.meta.out_slots)
    assert torch.equal(b.kv.k[b.meta.out_slots], b.k)
    assert torch.equal(b.kv.v[b.meta.out_slots], b.v)
    other = torch.ones(b.kv.k.shape[0], dtype=torch.bool)
    other[b.meta.out_slots] = False
    assert torch.equal(b.kv.k[other], before.k[other])
    assert torch.equal(b.kv.v[other], before.v[other])


def test_store_kv_casts_to_the_pool_dtype(tk):
    b = make_paged_batch([(2, 4)], 2, 2, 16, torch.bfloat16, seed=5)
    k32, v32 = torch.randn(4, 2, 16), torch.randn(4, 2, 16)
    tk.store_kv(k32, v32, b.kv.k, b.kv.v, b.meta.out_slots)
    assert torch.equal(b.kv.k[b.meta.out_slots], k32.bfloat16())
    assert torch.equal(b.kv.v[b.meta.out_slots], v32.bfloat16())


# -- decode -----------------------------------------------------------------------------------


@DTYPES
@pytest.mark.parametrize(
    ("page_size", "heads", "kv_heads", "splits"),
    [(1, 4, 4, 1), (16, 6, 2, 3), (1, 9, 3, 8)],
    ids=["p1-mha-1split", "p16-gqa3-3splits", "p1-gqa3-8splits"],
)
def test_decode_matches_reference(tk, dtype, page_size, heads, kv_heads, splits):
    # contexts of 1 (an empty prefix: fewer tokens than splits) up to 40 tokens
    spec = [(20, 1), (0, 1), (39, 1), (5, 1)]
    b = make_paged_batch(spec, heads, kv_heads, 32, dtype, page_size, seed=heads + splits)
    check_decode(tk, b, splits)


# -- extend -----------------------------------------------------------------------------------


@DTYPES
@pytest.mark.parametrize(
    ("page_size", "heads", "kv_heads"), [(1, 4, 2), (16, 6, 2)], ids=["p1-gqa2", "p16-gqa3"]
)
def test_extend_matches_reference(tk, dtype, page_size, heads, kv_heads):
    # empty and non-empty prefixes; extends shorter and longer than one 16-query block
    spec = [(0, 20), (13, 5), (0, 1), (30, 17), (3, 1)]
    b = make_paged_batch(spec, heads, kv_heads, 32, dtype, page_size, seed=page_size + heads)
    check_extend(tk, b)


# -- the backend: store, plan, attend ---------------------------------------------------------


@pytest.mark.parametrize(
    "spec", [[(4, 6), (0, 3), (9, 1)], [(4, 1), (0, 1), (40, 1)]], ids=["mixed", "decode"]
)
def test_backend_forward_equals_reference_backend(tk, monkeypatch, spec):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    backend = get_backend("triton")
    assert backend.name == "triton"
    b = make_paged_batch(spec, 6, 2, 16, page_size=4, seed=len(spec))
    want, pool = reference(b)
    poison_unused(b)
    got = backend.forward(b.q, b.k, b.v, b.kv, b.meta, b.scale)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert torch.equal(b.kv.k[b.meta.out_slots], pool.k[b.meta.out_slots])
    # a second layer reuses the plan derived once for this forward
    plan = b.meta.scratch["triton"]
    backend.forward(b.q, b.k, b.v, b.kv, b.meta, b.scale)
    assert b.meta.scratch["triton"] is plan


# -- the comparisons can fail -----------------------------------------------------------------


def test_a_wrong_softmax_scale_is_caught(tk):
    b = make_paged_batch([(6, 5), (0, 4)], 4, 2, 16, seed=11)
    want, _ = reference(b)
    got = run_extend(tk, b, scale=b.scale * 1.05)
    assert float((got - want).abs().max()) > 10 * TOL[torch.float32]["atol"]
    b = make_paged_batch([(6, 1), (20, 1)], 4, 2, 16, seed=12)
    want, _ = reference(b)
    got = run_decode(tk, b, splits=2, scale=b.scale * 1.05)
    assert float((got - want).abs().max()) > 10 * TOL[torch.float32]["atol"]


def test_a_causal_mask_off_by_one_is_caught(tk):
    """A kernel whose mask let each query see one key too far would produce what the
    reference gives when every query is moved one position later; that is far outside the
    tolerance, so the comparison above would fail."""
    b = make_paged_batch([(6, 5), (0, 4)], 4, 2, 16, seed=13)
    got = run_extend(tk, b)
    wrong = naive_masked(b, shift=1)
    right = naive_masked(b, shift=0)
    torch.testing.assert_close(got.double(), right, **TOL[torch.float32])
    assert float((got.double() - wrong).abs().max()) > 0.05


def naive_masked(b: PagedBatch, shift: int) -> torch.Tensor:
    """Float64 attention read straight from the pool (after the store), query at position p
    seeing keys at positions <= p + shift."""
    heads = b.q.shape[1]
    out, start = [], 0
    for row, prefix, ext in zip(b.meta.req_rows, b.meta.prefix_lens, b.meta.extend_lens):
        slots = b.meta.req_to_token[row, : prefix + ext]
        k = b.kv.k[slots].double()
        v = b.kv.v[slots].double()
        group = heads // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        q = b.q[start : start + ext].double()
        scores = torch.einsum("qhd,khd->hqk", q, k) * b.scale
        allowed = (
            torch.arange(prefix + ext)[None, :]
            <= torch.arange(prefix, prefix + ext)[:, None] + shift
        )
        probs = torch.softmax(scores.masked_fill(~allowed, -math.inf), -1)
        out.append(torch.einsum("hqk,khd->qhd", probs, v))
        start += ext
    return torch.cat(out)


def test_an_unwritten_output_element_is_caught(tk):
    """The NaN poison is what makes a skipped store visible: the same comparison fails when
    one query's output is left as it was."""
    b = make_paged_batch([(6, 5), (0, 4)], 4, 2, 16, seed=14)
    want, _ = reference(b)
    poison_unused(b)
    got = run_extend(tk, b)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    # a launch one query block short (max_extend 4 of 5, blocks of 4) never writes the first
    # request's fifth query: the poison stays there, and only there, and the comparison fails
    short = run_extend(tk, b, block=4, max_extend=4)
    assert torch.isnan(short).any(dim=(1, 2)).tolist() == [False] * 4 + [True] + [False] * 4
    with pytest.raises(AssertionError):
        torch.testing.assert_close(short, want, **TOL[torch.float32])


# -- the wide sweep (slow) --------------------------------------------------------------------

GQA = [(4, 4), (4, 2), (6, 2), (8, 1), (9, 3)]


def sweep_case(seed: int, decode: bool):
    g = torch.Generator().manual_seed(seed)
    heads, kv_heads = GQA[seed % len(GQA)]
    page_size = [1, 16, 2, 5][seed % 4]
    head_dim = [16, 32, 64, 48][(seed // 4) % 4]
    dtype = [torch.float32, torch.bfloat16][(seed // 2) % 2]
    spec = random_spec(g, max_requests=6, max_len=70, decode=decode)
    b = make_paged_batch(spec, heads, kv_heads, head_dim, dtype, page_size, seed=seed)
    return b


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(24))
def test_sweep_extend(tk, seed):
    check_extend(tk, sweep_case(seed, decode=False))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(24))
def test_sweep_decode(tk, seed):
    b = sweep_case(seed, decode=True)
    check_decode(tk, b, splits=[1, 2, 5, 16][seed % 4])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_sweep_extend_with_gpu_block_sizes(tk, seed):
    """The launch defaults the backend uses on a GPU (32x32 blocks)."""
    b = sweep_case(100 + seed, decode=False)
    want, _ = reference(b)
    poison_unused(b)
    torch.testing.assert_close(run_extend(tk, b, block=32), want, **TOL[b.q.dtype])
