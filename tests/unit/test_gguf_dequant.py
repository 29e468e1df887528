"""GGUF tensor decoding: dequantization against an independent reference, and the Q/K permutation.

The reference dequantizers below are written from the block formats alone (they parse the raw
bytes with numpy); they never call the gguf package's own dequantize, which is what
``engine.model.loader_gguf.dequantize_tensor`` uses under the hood.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.model.loader_gguf import (
    SUPPORTED_QUANTS,
    config_from_metadata,
    dequantize_tensor,
    permute_qk,
    unpermute_qk,
)

QK = 32  # elements per block of Q8_0 and Q4_1
Q8_0_BYTES = 2 + QK  # fp16 d, then 32 int8 q
Q4_1_BYTES = 2 + 2 + QK // 2  # fp16 d, fp16 m, then 16 bytes of nibbles


# -- independent reference dequantizers --------------------------------------------------------


def ref_dequant_q8_0(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """Q8_0: each block of 32 weights is an fp16 scale d then 32 int8 q; value = d * q."""
    buf = np.frombuffer(raw, dtype=np.uint8)
    assert buf.size % Q8_0_BYTES == 0
    blocks = buf.reshape(-1, Q8_0_BYTES)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # [n, 1]
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)  # [n, 32]
    return (d * q).reshape(shape)


def ref_dequant_q4_1(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """Q4_1: fp16 d, fp16 m, 16 bytes; byte j holds element j (low nibble) and j+16 (high)."""
    buf = np.frombuffer(raw, dtype=np.uint8)
    assert buf.size % Q4_1_BYTES == 0
    blocks = buf.reshape(-1, Q4_1_BYTES)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # [n, 1]
    m = blocks[:, 2:4].copy().view("<f2").astype(np.float32)  # [n, 1]
    packed = blocks[:, 4:]  # [n, 16]
    q = np.empty((blocks.shape[0], QK), dtype=np.float32)
    for j in range(QK // 2):
        q[:, j] = packed[:, j] & 0x0F
        q[:, j + QK // 2] = packed[:, j] >> 4
    return (d * q + m).reshape(shape)


# -- helpers ------------------------------------------------------------------------------------


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType]]) -> Path:
    """A GGUF file holding ``tensors`` (name -> (float array, type to store it as))."""
    w = GGUFWriter(str(path), "llama")
    for name, (arr, qtype) in tensors.items():
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            w.add_tensor(name, gguf.quants.quantize(arr, qtype))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def read_tensors(path: Path) -> dict[str, object]:
    return {str(t.name): t for t in GGUFReader(str(path)).tensors}


def raw_bytes(t: object) -> bytes:
    return np.ascontiguousarray(t.data).tobytes()  # type: ignore[attr-defined]


def block_view(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, QK)


def q8_0_error_bound(x: np.ndarray) -> np.ndarray:
    """Per-element bound on |x - dequant(quant(x))| for Q8_0: half a step, plus the fp16
    rounding of the scale times up to 127 steps (relative 2^-11 when normal, absolute 2^-25
    when subnormal), plus float32 slack."""
    d = np.abs(block_view(x)).max(axis=1, keepdims=True) / 127
    bound = d * (0.5 + 127 * 2.0**-11) + 127 * 2.0**-25 + 1e-7
    return np.broadcast_to(bound, block_view(x).shape).reshape(x.shape)


def q4_1_error_bound(x: np.ndarray) -> np.ndarray:
    b = block_view(x)
    lo, hi = b.min(axis=1, keepdims=True), b.max(axis=1, keepdims=True)
    d = (hi - lo) / 15
    fp16_d = d * 2.0**-11 + 2.0**-25  # rounding of d (normal or subnormal), likewise of m
    fp16_m = np.abs(lo) * 2.0**-11 + 2.0**-25
    bound = d * 0.5 + 15 * fp16_d + fp16_m + 1e-7
    return np.broadcast_to(bound, b.shape).reshape(x.shape)


@pytest.fixture(scope="module")
def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    return {
        "q8": rng.normal(0, 1.0, size=(6, 96)).astype(np.float32),
        "q4": rng.normal(0.3, 2.0, size=(5, 64)).astype(np.float32),
        "f32": rng.normal(0, 1.0, size=(3, 40)).astype(np.float32),
        "f16": rng.normal(0, 1.0, size=(7, 24)).astype(np.float32),
        "vec": rng.normal(1.0, 0.1, size=(48,)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory, arrays: dict[str, np.ndarray]) -> Path:
    T = GGMLQuantizationType
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return write_gguf(
        path,
        {
            "t.q8": (arrays["q8"], T.Q8_0),
            "t.q4": (arrays["q4"], T.Q4_1),
            "t.f32": (arrays["f32"], T.F32),
            "t.f16": (arrays["f16"], T.F16),
            "t.vec": (arrays["vec"], T.F32),
        },
    )


# -- dequantization -----------------------------------------------------------------------------


def test_reference_dequantizers_agree_with_a_hand_built_block() -> None:
    """Check the references themselves on bytes laid out by hand, so they are not circular."""
    # Q8_0: d = 0.5, q = -16 .. 15
    q = np.arange(-16, 16, dtype=np.int8)
    raw = np.float16(0.5).tobytes() + q.tobytes()
    np.testing.assert_array_equal(ref_dequant_q8_0(raw, (32,)), 0.5 * q.astype(np.float32))
    # Q4_1: d = 2, m = -1; element j has nibble j % 16 (low half) and 15 - j % 16 (high half)
    lows = np.arange(16, dtype=np.uint8)
    highs = 15 - lows
    raw = np.float16(2.0).tobytes() + np.float16(-1.0).tobytes() + (lows | highs << 4).tobytes()
    expect = np.concatenate([lows, highs]).astype(np.float32) * 2.0 - 1.0
    np.testing.assert_array_equal(ref_dequant_q4_1(raw, (32,)), expect)


@pytest.mark.parametrize(
    ("name", "key", "qtype", "ref", "bound"),
    [
        ("t.q8", "q8", "Q8_0", ref_dequant_q8_0, q8_0_error_bound),
        ("t.q4", "q4", "Q4_1", ref_dequant_q4_1, q4_1_error_bound),
    ],
)
def test_quantized_tensor_matches_reference(
    gguf_file: Path, arrays: dict[str, np.ndarray], name, key, qtype, ref, bound
) -> None:
    t = read_tensors(gguf_file)[name]
    orig = arrays[key]
    assert t.tensor_type.name == qtype
    # the bytes in the file are the bytes the quantizer produced
    expected_bytes = gguf.quants.quantize(orig, GGMLQuantizationType[qtype]).tobytes()
    assert raw_bytes(t) == expected_bytes

    out = dequantize_tensor(t)
    assert out.dtype == np.float32
    assert out.shape == orig.shape
    np.testing.assert_array_equal(out, ref(raw_bytes(t), orig.shape))
    err = np.abs(out - orig)
    assert np.all(err <= bound(orig)), f"max error {err.max()} exceeds the quantization bound"
    assert err.max() > 0  # it really was quantized


def test_f32_and_f16_round_trip(gguf_file: Path, arrays: dict[str, np.ndarray]) -> None:
    ts = read_tensors(gguf_file)
    assert ts["t.f32"].tensor_type.name == "F32"
    assert ts["t.f16"].tensor_type.name == "F16"
    out32 = dequantize_tensor(ts["t.f32"])
    np.testing.assert_array_equal(out32, arrays["f32"])
    out16 = dequantize_tensor(ts["t.f16"])
    assert out16.dtype == np.float32
    np.testing.assert_array_equal(out16, arrays["f16"].astype(np.float16).astype(np.float32))
    vec = dequantize_tensor(ts["t.vec"])
    assert vec.shape == (48,)
    np.testing.assert_array_equal(vec, arrays["vec"])
    # the loader hands these to torch.from_numpy and may edit them: they must be writeable
    assert out32.flags.writeable and vec.flags.writeable


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 4),
    blocks=st.integers(1, 3),
    scale=st.sampled_from([1e-3, 1.0, 50.0, 3e3]),
    seed=st.integers(0, 2**32 - 1),
    zero_block=st.booleans(),
)
def test_q8_0_property(
    tmp_path_factory: pytest.TempPathFactory,
    rows: int,
    blocks: int,
    scale: float,
    seed: int,
    zero_block: bool,
) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, blocks * QK)) * scale).astype(np.float32)
    if zero_block:
        x[0, :QK] = 0.0  # an all-zero block: scale 0, must decode to exact zeros
    path = write_gguf(
        tmp_path_factory.mktemp("prop") / "p.gguf", {"w": (x, GGMLQuantizationType.Q8_0)}
    )
    t = read_tensors(path)["w"]
    out = dequantize_tensor(t)
    assert out.shape == x.shape
    np.testing.assert_array_equal(out, ref_dequant_q8_0(raw_bytes(t), x.shape))
    assert np.all(np.abs(out - x) <= q8_0_error_bound(x))
    if zero_block:
        assert not out[0, :QK].any()


def test_unsupported_quant_type_written_to_a_file(tmp_path: Path) -> None:
    """TQ1_0 (ternary) can be written by the gguf package but is not one we dequantize."""
    assert "TQ1_0" not in SUPPORTED_QUANTS
    x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    path = write_gguf(
        tmp_path / "tq.gguf", {"blk.0.attn_q.weight": (x, GGMLQuantizationType.TQ1_0)}
    )
    t = read_tensors(path)["blk.0.attn_q.weight"]
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight") as info:
        dequantize_tensor(t)
    assert "TQ1_0" in str(info.value)


def test_unsupported_quant_type_fake_tensor() -> None:
    fake = SimpleNamespace(
        name="blk.3.ffn_down.weight", tensor_type=SimpleNamespace(name="IQ2_XXS")
    )
    with pytest.raises(ValueError) as info:
        dequantize_tensor(fake)
    assert "blk.3.ffn_down.weight" in str(info.value)
    assert "IQ2_XXS" in str(info.value)


# -- the Q/K permutation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_heads", "head_dim", "cols"), [(1, 2, 3), (2, 8, 5), (4, 16, 1), (6, 4, 7)]
)
def test_permute_then_unpermute_is_identity(n_heads: int, head_dim: int, cols: int) -> None:
    w = np.random.default_rng(n_heads).standard_normal((n_heads * head_dim, cols))
    p = permute_qk(w, n_heads)
    assert p.shape == w.shape
    np.testing.assert_array_equal(unpermute_qk(p, n_heads), w)
    np.testing.assert_array_equal(permute_qk(unpermute_qk(w, n_heads), n_heads), w)
    if head_dim > 2:
        assert not np.array_equal(p, w)  # it is a real reordering, not the identity


def test_unpermute_of_a_1d_bias_shaped_array() -> None:
    w = np.arange(2 * 8, dtype=np.float32)
    np.testing.assert_array_equal(unpermute_qk(permute_qk(w, 2), 2), w)


@pytest.mark.parametrize(("n_heads", "head_dim"), [(1, 4), (2, 8), (3, 6)])
def test_unpermute_turns_interleaved_pairs_into_rotate_half(n_heads: int, head_dim: int) -> None:
    """Rotate-half (Hugging Face) rotates rows (i, i + D/2) of each head together; llama.cpp
    stores the same pair on adjacent rows (2i, 2i + 1). Label every rotate-half row by
    (head, i, which half), lay the labels out interleaved by hand, and undo it."""
    half = head_dim // 2
    cols = 3
    # rotate-half layout: row h*D + i is pair i, first half; row h*D + half + i is pair i, second
    hf = np.zeros((n_heads * head_dim, cols))
    for h in range(n_heads):
        for i in range(half):
            hf[h * head_dim + i] = [h, i, 0]
            hf[h * head_dim + half + i] = [h, i, 1]
    # interleaved layout: row h*D + 2i holds pair i's first element, row h*D + 2i + 1 its second
    inter = np.zeros_like(hf)
    for h in range(n_heads):
        for i in range(half):
            inter[h * head_dim + 2 * i] = [h, i, 0]
            inter[h * head_dim + 2 * i + 1] = [h, i, 1]
    np.testing.assert_array_equal(unpermute_qk(inter, n_heads), hf)
    np.testing.assert_array_equal(permute_qk(hf, n_heads), inter)


# -- metadata -------------------------------------------------------------------------------------


def _llama_meta(**extra: object) -> dict[str, object]:
    meta: dict[str, object] = {
        "general.architecture": "llama",
        "llama.embedding_length": 64,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.feed_forward_length": 128,
        "llama.block_count": 2,
        "llama.vocab_size": 300,
    }
    meta.update(extra)
    return meta


def test_config_from_metadata_reads_the_numbers() -> None:
    cfg = config_from_metadata(
        _llama_meta(**{"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    )
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (64, 4, 2, 16)
    assert (cfg.intermediate_size, cfg.num_layers, cfg.vocab_size) == (128, 2, 300)
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_config_from_metadata_rejects_an_unsupported_architecture() -> None:
    meta = _llama_meta()
    meta["general.architecture"] = "gpt2"
    with pytest.raises(ValueError, match="'gpt2'"):
        config_from_metadata(meta)


def test_config_from_metadata_names_a_missing_key() -> None:
    meta = _llama_meta()
    del meta["llama.block_count"]
    with pytest.raises(ValueError, match=r"llama\.block_count"):
        config_from_metadata(meta)
