"""The native CPU ops (kernels/cpu_ops.cpp) against the Python ops they stand in for, and how
the engine finds them: built for this CPU or not at all, with an off switch."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.model import fused
from engine.model.fused import add_norm, apply_rope, layer_ops, rms_norm, silu_mul
from kernels import cpu_ops
from kernels.torch_ref import NATIVE_DTYPES

ROOT = Path(__file__).resolve().parents[2]
needs_native = pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))
DTYPES = [torch.float32, torch.bfloat16]


def rope_inputs(rows: int, dtype: torch.dtype, d: int = 64) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(rows)
    qkv = torch.randn(rows, 15 * d, generator=g).to(dtype)  # 9 + 3 heads rotated, 3 not
    qk = qkv[:, : 12 * d].reshape(rows, 12, d)  # a row-strided view, as the forward has
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = (torch.arange(rows).float() + 37)[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return qk, emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


@needs_native
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,d", [(1, 64), (3, 64), (64, 64), (512, 64), (5, 128), (5, 16)])
def test_native_rope_gives_the_python_ops_bits(rows, d, dtype):
    """Exact mode runs the native rope: the same roundings in the same order, no FMA (head
    sizes whose half is 16 columns or more in vector loops, 16 in the scalar one)."""
    qk, cos, sin = rope_inputs(rows, dtype, d)
    want = apply_rope(qk, cos, sin)
    got = torch.ops.attest.rope_(qk.clone(), cos, sin)
    assert torch.equal(got, want)
    inplace = qk.clone()
    torch.ops.attest.rope_(inplace, cos, sin)
    assert torch.equal(inplace, want)  # in place, through the view's strides


def odd_bfloat16(rows: int, cols: int, seed: int) -> torch.Tensor:
    """bfloat16 values with the kinds of lane the rounding treats apart: denormals (the smallest
    and the largest), NaNs with other payloads than torch's 0x7fc0 and either sign, infinities,
    and ordinary values, scattered."""
    g = torch.Generator().manual_seed(seed)
    odd = (
        torch.tensor(
            [0x0001, 0x807F, 0x0040, 0x7FC1, 0xFFC3, 0x7F81, 0x7F80, 0xFF80, 0x0080, 0x3F80],
            dtype=torch.int32,
        )
        .to(torch.int16)
        .view(torch.bfloat16)
    )
    x = torch.randn(rows, cols, generator=g).bfloat16()
    where = torch.rand(rows, cols, generator=g) < 0.2
    pick = torch.randint(0, len(odd), (rows, cols), generator=g)
    return torch.where(where, odd[pick], x)


@needs_native
def test_the_native_roundings_of_denormals_and_nans_are_torchs():
    """The bfloat16 roundings of the native rope and residual add are torch's for every kind
    of value: a product that lands on a float32 denormal, an infinity, a NaN. Compared as
    integers, a NaN as a NaN (its payload is not the same: torch's vector loops write 0xffff,
    c10's rounding 0x7fc0, the native ops' too)."""
    rows, d = 64, 64
    qk = odd_bfloat16(rows, 12 * d, seed=1).reshape(rows, 12, d)
    # cos and sin that take some products below float32's normals: 2^-120 times a denormal-ish x
    cos = odd_bfloat16(rows, d, seed=2)[:, None, :] * 2**-100
    sin = odd_bfloat16(rows, d, seed=3)[:, None, :]

    def same(got: torch.Tensor, want: torch.Tensor) -> None:
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
        assert (want.float().abs() < 2**-126).any()  # the denormals were met

    same(torch.ops.attest.rope_(qk.clone(), cos, sin), apply_rope(qk, cos, sin))
    x, y = odd_bfloat16(rows, 576, seed=4), odd_bfloat16(rows, 576, seed=5) * 2**-120
    h_want, _ = add_norm(x, y, torch.ones(576, dtype=torch.bfloat16), 1e-5)
    h = x.clone()
    torch.ops.attest.add_rms_norm(h, y, torch.ones(576, dtype=torch.bfloat16), 1e-5)
    same(h, h_want)


@needs_native
@pytest.mark.parametrize("rows,n", [(1, 576), (16, 576), (512, 576), (3, 100), (2, 7)])
def test_native_norms_match_the_python_ones_in_bfloat16(rows, n):
    """A prefill's rows too, and widths that end in a part of a vector."""
    g = torch.Generator().manual_seed(rows)
    x, y = (torch.randn(rows, n, generator=g).bfloat16() for _ in range(2))
    w = torch.randn(n, generator=g).bfloat16()
    want = rms_norm(x, w, 1e-5)
    got = torch.ops.attest.rms_norm(x, w, 1e-5)
    # the sum of squares adds in another order: rarely apart, by a step or two of bfloat16
    # (the normalised value is rounded, then rounded again times the weight)
    assert (got != want).float().mean() < 0.01
    torch.testing.assert_close(got.float(), want.float(), atol=0, rtol=2**-6)
    h_want, n_want = add_norm(x, y, w, 1e-5)
    h = x.clone()
    n_got = torch.ops.attest.add_rms_norm(h, y, w, 1e-5)
    assert torch.equal(h, h_want)  # the residual add, in place, bit for bit
    torch.testing.assert_close(n_got.float(), n_want.float(), atol=0, rtol=2**-6)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "rows,n", [(1, 1536), (7, 1536), (512, 1536), (3, 40), (3, 48), (4, 100), (2, 96), (5, 7)]
)
def test_native_silu_mul_gives_torchs_bits(rows, n, dtype):
    """Exact mode runs it: torch's silu then the product, each rounded, torch's vector exp
    where torch's vector loop runs and its scalar loop's exp for the rest of a row."""
    g = torch.Generator().manual_seed(rows * n)
    gate_up = (torch.randn(rows, 2 * n, generator=g) * 6).to(dtype)  # far into both tails
    gate_up[0, :4] = torch.tensor([0.0, -0.0, 88.0, -104.0])  # exp's edges: 1, overflow, 0
    want = silu_mul(gate_up)
    got = torch.ops.attest.silu_mul(gate_up)
    assert got.dtype == dtype and got.shape == (rows, n)
    assert torch.equal(got, want)
    wide = torch.zeros(rows, 2 * n + 8, dtype=dtype)
    wide[:, : 2 * n] = gate_up  # rows further apart than 2n: read by the row stride
    assert torch.equal(fused.native_silu_mul(wide[:, : 2 * n]), want)


@needs_native
def test_every_bfloat16_gate_gives_torchs_bits():
    """A bfloat16 gate's silu is looked up in a table of all 65,536 values: each of them (NaNs,
    infinities, subnormals, both zeros among them), times ups of several sizes, as torch gives."""
    gates = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    gates = gates.reshape(1024, 64)  # whole vector pairs: every gate in torch's vector loop
    for up in (1.0, -3.5, 1e-3, 7e4):
        gate_up = torch.cat([gates, torch.full_like(gates, up)], dim=1)
        got, want = torch.ops.attest.silu_mul(gate_up), silu_mul(gate_up)
        # the same values to the bit; a NaN is a NaN (torch's vector loop writes 0xffff for
        # it, c10's cast 0x7fc0)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@needs_native
def test_a_transposed_products_view_takes_torchs_silu_mul(monkeypatch):
    calls = []
    monkeypatch.setattr(fused, "silu_mul", lambda t: calls.append(t.shape) or silu_mul(t))
    gate_up = torch.randn(8, 4).bfloat16()
    fused.native_silu_mul(gate_up)
    fused.native_silu_mul(gate_up.t().contiguous().t())  # a column-major view, as (W @ x.T).T
    assert calls == [(8, 4)]


@needs_native
def test_exact_mode_takes_only_the_ops_that_keep_torchs_bits():
    exact, fast = layer_ops(1e-5, torch.float32), layer_ops(1e-5, torch.bfloat16)
    assert exact.rope is fused.native_rope and fast.rope is fused.native_rope
    assert exact.silu_mul is fused.native_silu_mul and fast.silu_mul is fused.native_silu_mul
    assert exact.norm.func is rms_norm and exact.add_norm.func is add_norm
    assert fast.norm.func is fused.native_norm and fast.add_norm.func is fused.native_add_norm
    off = layer_ops(1e-5, torch.bfloat16, native=False)
    assert off.rope is apply_rope and off.norm.func is rms_norm and off.silu_mul is silu_mul


@needs_native
def test_rows_past_the_bound_take_torchs_norm(monkeypatch):
    calls = []
    monkeypatch.setattr(fused, "rms_norm", lambda *a: calls.append(len(a[0])) or rms_norm(*a))
    w, bound = torch.ones(8).bfloat16(), fused.SCALAR_NORM_ROWS
    fused.native_norm(torch.randn(bound, 8).bfloat16(), w, 1e-5, rows=bound)
    fused.native_norm(torch.randn(bound + 1, 8).bfloat16(), w, 1e-5, rows=bound)
    fused.native_norm(torch.randn(512, 8).bfloat16(), w, 1e-5, rows=math.inf)
    assert calls == [bound + 1]


@needs_native
def test_the_norms_bound_follows_their_loops(monkeypatch):
    """Vector loops take a prefill's rows (they were faster at every count measured); scalar
    ones only up to ``SCALAR_NORM_ROWS``, past which torch's norm was faster."""
    assert fused.norm_rows() == (
        math.inf if torch.ops.attest.rows_vectorised() else fused.SCALAR_NORM_ROWS
    )
    assert layer_ops(1e-5, torch.bfloat16).norm.keywords["rows"] == fused.norm_rows()


@needs_native
def test_a_transposed_product_past_a_few_rows_takes_torchs_rope(monkeypatch):
    """The native rope reads a transposed product column by column, slower than torch's past
    ``NATIVE_ROPE_STRIDED_ROWS``; a dense one takes the native rope at any count."""
    calls = []
    monkeypatch.setattr(
        fused, "apply_rope", lambda x, c, s: calls.append(len(x)) or apply_rope(x, c, s)
    )
    for rows, dense in (
        (fused.NATIVE_ROPE_STRIDED_ROWS, False),
        (fused.NATIVE_ROPE_STRIDED_ROWS + 1, False),
        (512, True),
    ):
        x = torch.randn(rows, 2 * 64) if dense else torch.randn(2 * 64, rows).t()
        cos, sin = torch.randn(rows, 1, 64), torch.randn(rows, 1, 64)
        fused.native_rope(x.reshape(rows, 2, 64) if dense else x.unflatten(1, (2, 64)), cos, sin)
    assert calls == [fused.NATIVE_ROPE_STRIDED_ROWS + 1]


def test_a_library_is_keyed_by_the_cpu_it_was_built_for(monkeypatch):
    here = cpu_ops.build_dir()
    monkeypatch.setattr(cpu_ops, "cpu_flags", lambda: frozenset({"sse2", "avx2", "fma"}))
    other = cpu_ops.build_dir()
    assert here != other and here.parent == other.parent == cpu_ops.ROOT


def run_status(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kernels.cpu_ops", "status"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=True,
    )
    return done.stdout


@needs_native
def test_the_off_switch_turns_the_native_ops_off():
    assert "attest_cpu_ops.so" in run_status({"ATTEST_NATIVE_OPS": "1"})
    assert "turned off (ATTEST_NATIVE_OPS=0)" in run_status({"ATTEST_NATIVE_OPS": "0"})


@needs_native
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_native_rope_reads_a_column_of_a_product(dtype):
    """One row in float32 comes back as a column of a two-column product (``linear``): the
    native rope reads and writes it by its strides."""
    qk, cos, sin = rope_inputs(1, dtype)
    col = torch.stack([qk.reshape(-1), torch.zeros(12 * 64, dtype=dtype)], dim=1)  # [768, 2]
    view = col[:, :1].t().reshape(1, 12, 64)
    assert view.stride(-1) == 2
    want = apply_rope(qk, cos, sin)
    assert torch.equal(torch.ops.attest.rope_(view, cos, sin), want)
    assert torch.equal(col[:, 0].reshape(1, 12, 64), want)  # written in place


@needs_native
@pytest.mark.parametrize("n", [1, 7, 16, 17, 100, 49152])
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_native_argmax_is_torchs(rows, n):
    """Greedy sampling's native argmax: the first of equal maxima, a row of -inf (or of -0.0
    and 0.0) its first, a NaN where one is, rows read by their stride."""
    g = torch.Generator().manual_seed(rows * n)
    x = torch.randint(-3, 4, (rows, n + 5), generator=g).float()[:, :n]  # ties; rows apart
    x[0] = float("-inf")
    x[rows - 1, torch.randint(0, n, (1,), generator=g)] = float("nan")
    if rows > 2:
        x[1] = -0.0
        x[1, n // 2 :] = 0.0
    assert x.stride(0) == n + 5
    assert torch.equal(torch.ops.attest.argmax_rows(x), x.argmax(dim=-1))


@needs_native
@pytest.mark.parametrize("n", [1, 7, 16, 17, 100, 49152])
@pytest.mark.parametrize("k", [1, 3, 8, 100])
def test_native_top_rows_are_the_k_largest_in_order(n, k):
    """The LM head's refined entries: each row's k largest in descending order, a NaN above any
    number, of equal values the first, rows read by their stride; torch's ``topk`` holds the same
    values (its choice among equal ones is its own)."""
    if k > n:
        k = n
    g = torch.Generator().manual_seed(n * k)
    x = torch.randint(-3, 4, (4, n + 5), generator=g).float()[:, :n]  # ties; rows apart
    x[0] = float("-inf")
    x[2, torch.randint(0, n, (2,), generator=g)] = float("nan")
    x[3] = torch.randn(n, generator=g)
    top = torch.ops.attest.top_rows(x, k)
    got = x.gather(1, top)
    assert torch.equal(got.nan_to_num(99.0), x.topk(k, dim=1).values.nan_to_num(99.0))
    for r in range(4):  # the order itself: larger first, then the earlier of equals
        row = x[r].nan_to_num(99.0).tolist()
        want = sorted(range(n), key=lambda i: (-row[i], i))[:k]
        assert top[r].tolist() == want, r


@needs_native
def test_native_top_rows_refuses_what_it_cannot_rank():
    with pytest.raises(RuntimeError, match="k must be 1 to"):
        torch.ops.attest.top_rows(torch.zeros(2, 4), 5)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.attest.top_rows(torch.zeros(2, 4, dtype=torch.bfloat16), 1)


@needs_native
def test_the_boot_receipt_says_up_to_how_many_rows_the_norms_are_native(tiny_model_dir, tmp_path):
    import json

    from engine import LLM

    for dtype, want in (("float32", 0), ("bfloat16", fused.norm_rows())):
        log = tmp_path / f"{dtype}.jsonl"
        llm = LLM(model=tiny_model_dir, kv_tokens=256, dtype=dtype, log_file=str(log))
        [weights] = [json.loads(x) for x in log.read_text().splitlines() if '"boot.weights"' in x]
        assert weights["norm_rows"] == ("any" if want == math.inf else want), dtype
        llm.close()


@needs_native
@pytest.mark.parametrize("src,pool", NATIVE_DTYPES, ids=str)
@pytest.mark.parametrize("rows", [1, 7, 512])
def test_native_store_kv_writes_what_index_copy_writes(rows, src, pool):
    """A prefill chunk's K/V go into the pool by the native copy: the rows ``store_kv`` (torch's
    index_copy_) writes, bit for bit, cast to the pool's dtype, from the row-strided views of the
    fused QKV product, at scattered slots; nothing else in the pool touched."""
    from kernels.attention import LayerKV, store_kv

    g = torch.Generator().manual_seed(rows)
    qkv = torch.randn(rows, 15 * 64, generator=g).to(src)
    k = qkv[:, 9 * 64 : 12 * 64].unflatten(1, (3, 64))  # strided rows, as the forward has them
    v = qkv[:, 12 * 64 :].unflatten(1, (3, 64))
    size = (2 * rows + 5, 3, 64)
    slots = torch.randperm(size[0], generator=g)[:rows]
    want = LayerKV(torch.randn(size, generator=g).to(pool), torch.randn(size, generator=g).to(pool))
    got = LayerKV(want.k.clone(), want.v.clone())
    store_kv(k, v, want, slots)
    torch.ops.attest.store_kv(k, v, got.k, got.v, slots)
    bits = torch.int16 if pool == torch.bfloat16 else torch.int32
    assert torch.equal(got.k.view(bits), want.k.view(bits))
    assert torch.equal(got.v.view(bits), want.v.view(bits))


@needs_native
def test_native_store_kv_refuses_a_slot_outside_the_pool_and_a_pair_it_does_not_take():
    """A slot past the pool's end is an error naming it, not a write past the pool; so is a
    pair of dtypes the native attention does not take (float32 rows into a bfloat16 pool)."""
    k = torch.ones(2, 3, 64)
    pool_k, pool_v = torch.zeros(4, 3, 64), torch.zeros(4, 3, 64)
    with pytest.raises(RuntimeError, match="slot 4 outside 0..3"):
        torch.ops.attest.store_kv(k, k, pool_k, pool_v, torch.tensor([1, 4]))
    assert not pool_k.any() and not pool_v.any()
    half = torch.zeros(4, 3, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="Float with a BFloat16 pool"):
        torch.ops.attest.store_kv(k, k, half, half.clone(), torch.tensor([1, 2]))


@needs_native
@pytest.mark.parametrize("bad", [4, -1])
def test_native_decode_attention_refuses_a_slot_outside_the_pool_before_writing(bad):
    """The step's own K/V go into the pool at out_slots before it attends: a slot past the
    pool's either end is an error naming it, with nothing written, not a write past the pool."""
    q = torch.ones(2, 6, 64)
    k = torch.ones(2, 3, 64)
    pool_k, pool_v = torch.zeros(4, 3, 64), torch.zeros(4, 3, 64)
    slots = torch.tensor([[0, 1], [2, 3]])
    lens = torch.tensor([2, 2])
    with pytest.raises(RuntimeError, match=f"decode_attention: slot {bad} outside 0..3"):
        torch.ops.attest.decode_attention(
            q, k, k, pool_k, pool_v, torch.tensor([1, bad]), slots, lens, 0.125
        )
    assert not pool_k.any() and not pool_v.any()
