"""The decode graphs' pure parts: which buckets are captured, which bucket a batch pads up to,
the padded input block, and why graphs are off."""

from __future__ import annotations

import pytest
import torch

from engine.model.graphs import (
    IDS,
    LENS,
    PAD_SLOT,
    POSITIONS,
    SLOTS,
    bucket_for,
    capture_or_eager,
    capture_sizes,
    decode_block,
    graphs_off,
)


def test_capture_sizes_double_to_16_then_step_by_8_then_16_and_end_at_the_max():
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert capture_sizes(128) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128]
    assert capture_sizes(1) == [1]
    assert capture_sizes(5) == [1, 2, 4, 5]
    assert capture_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    with pytest.raises(ValueError, match="max_batch"):
        capture_sizes(0)


@pytest.mark.parametrize("top", [1, 3, 17, 64, 100, 256])
def test_every_batch_up_to_the_max_has_a_bucket_less_than_twice_it_and_half_again_past_16(top):
    sizes = capture_sizes(top)
    for n in range(1, top + 1):
        b = bucket_for(n, sizes)
        assert b is not None and n <= b <= top
        assert b == min(s for s in sizes if s >= n)  # the smallest that holds it
        assert b < 2 * n
        if n > 16:
            assert b - n <= n // 2  # padding stays a fraction of the batch
    assert bucket_for(top + 1, sizes) is None
    assert bucket_for(0, sizes) is None


def test_decode_block_pads_rows_to_the_padding_slot_with_a_one_token_context():
    block = decode_block([7, 9], [3, 10], torch.tensor([21, 44]), 4)
    assert block.dtype == torch.int64 and block.shape == (4, 4)
    assert block[IDS].tolist() == [7, 9, 0, 0]
    assert block[POSITIONS].tolist() == [3, 10, 0, 0]
    assert block[SLOTS].tolist() == [21, 44, PAD_SLOT, PAD_SLOT]
    assert block[LENS].tolist() == [4, 11, 1, 1]  # a request's context includes its new token
    with pytest.raises(ValueError, match="for 1"):
        decode_block([1, 2], [0, 0], [5, 6], 1)
    with pytest.raises(ValueError, match="2 tokens, 1 lengths"):
        decode_block([1, 2], [0], [5, 6], 4)


def test_graphs_are_off_with_a_reason_on_cpu_eager_groups_and_the_torch_backend():
    assert graphs_off("cuda", False, 1, 1, "triton") is None
    assert graphs_off("cuda:1", False, 1, 1, "flashinfer") is None
    assert "CUDA device" in graphs_off("cpu", False, 1, 1, "triton")
    assert "enforce_eager" in graphs_off("cuda", True, 1, 1, "triton")
    assert "2 ranks" in graphs_off("cuda", False, 2, 1, "triton")
    assert "2 stages" in graphs_off("cuda", False, 1, 2, "flashinfer")
    assert "fixed-address" in graphs_off("cuda", False, 1, 1, "torch")
    assert "fixed-address" in graphs_off("cuda", False, 1, 1, "torch-padded")


def test_a_capture_that_raises_leaves_the_engine_eager_and_says_why():
    def fails():
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    graphs, fields = capture_or_eager(fails)
    assert graphs is None and fields["captured"] == []
    assert (
        fields["why"]
        == "capture failed: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    done = object()
    assert capture_or_eager(lambda: (done, {"captured": [1]})) == (done, {"captured": [1]})
