"""The native extend kernel (kernels/cpu_extend.cpp), which attends a prefill chunk's tokens to
their contexts in the pool, against SDPA over the gathered context (the path it replaces, still
the one for other head sizes and on a GPU): random page tables, prefixes and chunk lengths on
both sides of its blocks of sixteen, GQA groups up to 8, head sizes 64 and 128; bfloat16 chunks
every way this CPU runs them: the laid-out method on AMX's tiles and on AVX-512 BF16 vectors,
and the item loops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels import cpu_ops
from kernels.attention import HeadShape, LayerKV
from kernels.torch_ref import TorchReferenceBackend
from tests.unit.paged_batch import make_paged_batch

pytestmark = pytest.mark.skipif(not cpu_ops.load(), reason=str(cpu_ops.why_not()))

# float32 sums in another order than SDPA's; bfloat16 rounds the weights of V for its products
TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


@pytest.fixture(params=cpu_ops.extend_ways() or ["loops"])
def way(request):
    """bfloat16 chunks on AMX's tiles, on AVX-512 BF16 vectors, or by the item loops."""
    was = torch.ops.attest.set_extend_way(request.param)
    yield request.param
    torch.ops.attest.set_extend_way(was)


def native_and_sdpa(b, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(native, SDPA) outputs of one batch (its q, k and v in ``dtype`` when given), each from
    its own copy of the pool, and the native forward's scratch (which says whether the native
    kernel took it)."""
    q, k, v = (t if dtype is None else t.to(dtype) for t in (b.q, b.k, b.v))
    kv_n, kv_s = b.pool_copy(), b.pool_copy()
    got = TorchReferenceBackend("native").forward(q, k, v, kv_n, b.meta, b.scale)
    want = TorchReferenceBackend("grouped").forward(q, k, v, kv_s, b.meta, b.scale)
    assert torch.equal(kv_n.k, kv_s.k) and torch.equal(kv_n.v, kv_s.v)  # the same writes
    return got, want, b.meta.scratch


# the fixture sets one switch for every input alike
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    gqa=st.sampled_from([(4, 4), (4, 2), (9, 3), (8, 2), (8, 1)]),
    head_dim=st.sampled_from([64, 128]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    page_size=st.sampled_from([1, 4]),
    spec=st.lists(st.tuples(st.integers(0, 40), st.integers(18, 70)), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_native_extends_equal_sdpa_over_the_gathered_context(
    way, gqa, head_dim, dtype, page_size, spec, seed
):
    b = make_paged_batch(spec, gqa[0], gqa[1], head_dim, dtype, page_size, seed)
    got, want, scratch = native_and_sdpa(b)
    assert "native_extend" in scratch  # the native kernel took it
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@pytest.mark.parametrize("head_dim", [64, 128])
def test_short_and_long_chunks_in_one_call_with_scores_that_keep_rising(way, head_dim):
    """Requests of 1, 5 and 15 new tokens (under the laid-out method's 16: the item loops)
    beside ones of 16, 40 and 97 (laid out, where the way is), prefixes on both sides of a block
    of 32 keys; the keys grow with their position, so a query's largest score keeps rising block
    after block and the laid-out method's lazily raised reference moves many times."""
    spec = [(30, 1), (0, 97), (7, 5), (33, 40), (64, 16), (3, 15)]
    b = make_paged_batch(spec, 8, 2, head_dim, torch.bfloat16, page_size=4, seed=7)
    width = b.meta.req_to_token.shape[1]
    for row, (prefix, ext) in zip(b.meta.req_rows, spec):
        slots = b.meta.req_to_token[row, : prefix + ext]
        ramp = (torch.arange(prefix + ext, dtype=torch.float32) / 8).to(torch.bfloat16)
        b.kv.k[slots[:prefix]] = (b.kv.k[slots[:prefix]].abs() * ramp[:prefix, None, None]).to(
            b.kv.k.dtype
        )
    assert width >= max(p + e for p, e in spec)
    first = 0
    for prefix, ext in spec:  # the new keys keep the ramp, the queries all positive
        ramp = (torch.arange(prefix, prefix + ext, dtype=torch.float32) / 8)[:, None, None]
        b.k[first : first + ext] = (b.k[first : first + ext].float().abs() * ramp).to(b.k.dtype)
        first += ext
    b.q.copy_(b.q.abs())
    got, want, scratch = native_and_sdpa(b)
    assert "native_extend" in scratch
    torch.testing.assert_close(got.float(), want.float(), **TOL[torch.bfloat16])


def test_bfloat16_queries_on_a_float32_pool():
    b = make_paged_batch([(5, 40), (0, 33)], 9, 3, 64, torch.float32, page_size=4, seed=2)
    got, want, scratch = native_and_sdpa(b, torch.bfloat16)
    assert "native_extend" in scratch
    torch.testing.assert_close(got.float(), want.float(), **TOL[torch.bfloat16])


def test_other_head_sizes_stay_on_sdpa():
    b = make_paged_batch([(3, 30)], 4, 2, 16, seed=1)
    got, want, scratch = native_and_sdpa(b)
    assert "native_extend" not in scratch
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_the_kernel_refuses_a_chunk_past_its_slots():
    b = make_paged_batch([(3, 30)], 4, 2, 64, seed=1)
    kv: LayerKV = b.pool_copy()
    width = b.meta.req_to_token.shape[1]
    slots = b.meta.req_to_token[b.meta.req_rows[0] : b.meta.req_rows[0] + 1, :width]
    past = torch.tensor([width], dtype=torch.int64)  # a prefix as long as the whole row
    one, zero = torch.tensor([1], dtype=torch.int64), torch.tensor([0], dtype=torch.int64)
    with pytest.raises(RuntimeError, match="reads past its slots"):
        torch.ops.attest.extend_attention(b.q, kv.k, kv.v, slots, past, zero, one, b.scale)


def test_a_cpu_without_avx512_stays_on_sdpa(monkeypatch):
    monkeypatch.setattr(cpu_ops, "vector_512", lambda: False)
    b = make_paged_batch([(3, 30)], 9, 3, 64, seed=1)
    got, want, scratch = native_and_sdpa(b)
    assert "native_extend" not in scratch
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("faster", ["native", "sdpa"])
def test_the_boot_times_both_ways_and_the_faster_attends_every_prefill_chunk(monkeypatch, faster):
    """``prepare`` times the native kernel against SDPA over one chunk (which wins depends on
    the CPU: AMX tiles speed SDPA's flash kernel), keeps the faster for every later chunk, and
    the boot receipt's ``attention`` says which, with what each took."""
    import kernels.torch_ref as torch_ref

    monkeypatch.delenv("ATTEST_EXTEND", raising=False)
    timed = []

    def fake(fns, *a, **kw):  # the ways' seconds as if timed: the named one twice as fast
        timed.append(len(fns))
        return [1e-3 if way == faster else 2e-3 for way in torch_ref.EXTEND_WAYS]

    monkeypatch.setattr(torch_ref, "fastest_each", fake)
    backend = TorchReferenceBackend("native")
    backend.prepare(HeadShape(9, 3, 64, torch.bfloat16, torch.bfloat16))
    assert timed == [2]
    said = backend.kernels(HeadShape(9, 3, 64, torch.bfloat16, torch.bfloat16))
    us = {w: 1000.0 if w == faster else 2000.0 for w in torch_ref.EXTEND_WAYS}
    assert said["extend"] == faster and said["extend_us"] == us, said
    b = make_paged_batch([(5, 40), (0, 33)], 9, 3, 64, torch.bfloat16, page_size=4, seed=2)
    kv = b.pool_copy()
    backend.forward(b.q, b.k, b.v, kv, b.meta, b.scale)
    assert ("native_extend" in b.meta.scratch) == (faster == "native"), b.meta.scratch.keys()
    assert ("extend" in b.meta.scratch) == (faster == "sdpa")
    # decodes beside a chunk: SDPA would take each decode alone, a call per request and layer;
    # the native kernel takes the whole forward whichever way was timed faster
    b = make_paged_batch([(30, 1), (12, 1), (0, 40)], 9, 3, 64, torch.bfloat16, seed=4)
    backend.forward(b.q, b.k, b.v, b.pool_copy(), b.meta, b.scale)
    assert "native_extend" in b.meta.scratch and "extend" not in b.meta.scratch


def test_the_environment_fixes_the_way_and_nothing_is_timed_where_one_way_runs(monkeypatch):
    import kernels.torch_ref as torch_ref

    monkeypatch.setattr(torch_ref, "fastest_each", lambda *a, **kw: pytest.fail("timed"))
    monkeypatch.setenv("ATTEST_EXTEND", "sdpa")
    backend = TorchReferenceBackend("native")
    backend.prepare(HeadShape(9, 3, 64, torch.float32, torch.float32))
    said = backend.kernels(HeadShape(9, 3, 64, torch.float32, torch.float32))
    assert said["extend"] == "sdpa" and "extend_us" not in said
    monkeypatch.delenv("ATTEST_EXTEND")
    for heads, kv_heads, head_dim in ((4, 2, 16), (16, 1, 64)):  # head size 16; a group of 16
        backend = TorchReferenceBackend("native")
        backend.prepare(HeadShape(heads, kv_heads, head_dim, torch.float32, torch.float32))
        assert backend.kernels(
            HeadShape(heads, kv_heads, head_dim, torch.float32, torch.float32)
        ) == {
            "decode": "native, general loops",
            "extend": "sdpa",
        }
    TorchReferenceBackend("grouped").prepare(HeadShape(9, 3, 64, torch.float32, torch.float32))
    monkeypatch.setenv("ATTEST_EXTEND", "sideways")
    with pytest.raises(ValueError, match="ATTEST_EXTEND must be native, sdpa or measure"):
        TorchReferenceBackend("native").prepare(HeadShape(9, 3, 64, torch.float32, torch.float32))


def test_the_receipt_says_the_way_a_bfloat16_chunk_runs(way, monkeypatch):
    monkeypatch.setenv("ATTEST_EXTEND", "native")  # untimed: the native kernel takes the chunks
    backend = TorchReferenceBackend("native")
    for dtype, said in ((torch.bfloat16, way), (torch.float32, "loops")):
        shape = HeadShape(9, 3, 64, dtype, dtype)
        backend.prepare(shape)
        kernels = backend.kernels(shape)
        assert kernels["extend"] == "native" and kernels["extend_way"] == said


def test_a_way_this_cpu_cannot_run_is_refused_by_name_and_the_way_kept():
    was = torch.ops.attest.extend_way()
    refused = ["sideways"] + [w for w in ("tiles", "pairs") if w not in cpu_ops.extend_ways()]
    for name in refused:
        with pytest.raises(RuntimeError, match=f"'{name}' cannot run here"):
            torch.ops.attest.set_extend_way(name)
        assert torch.ops.attest.extend_way() == was


@pytest.mark.parametrize(
    "env, said",
    [("loops", "loops"), ("sideways", "ATTEST_EXTEND_WAY must be loops, pairs or tiles")],
)
def test_the_environment_caps_the_way(env, said):
    ask = (
        "from kernels import cpu_ops; cpu_ops.load(); import torch; "
        "print(torch.ops.attest.extend_way())"
    )
    run = subprocess.run(
        [sys.executable, "-c", ask],
        env={**os.environ, "ATTEST_EXTEND_WAY": env},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=False,
    )
    assert said in run.stdout + run.stderr
    assert (run.returncode == 0) == (env == "loops")
