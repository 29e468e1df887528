import pytest
import torch

from engine.model.fused import apply_rope, rms_norm
from engine.model.llama import linear


@pytest.mark.parametrize("rows", [1, 2, 3, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_equals_x_times_w_transposed(rows, dtype):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 48, generator=g).to(dtype)
    w = torch.randn(80, 48, generator=g).to(dtype)
    out = linear(x, w)
    assert out.shape == (rows, 80) and out.dtype == dtype
    ref = x.double() @ w.double().t()
    tol = 1e-4 if dtype == torch.float32 else 0.1
    assert torch.allclose(out.double(), ref, atol=tol, rtol=tol)


def test_rms_norm_normalises_in_float32():
    x = torch.randn(4, 64)
    w = torch.rand(64) + 0.5
    out = rms_norm(x, w, 1e-5)
    ref = w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.allclose(out, ref, atol=1e-6)


def test_rope_rotates_pairs_half_apart_and_keeps_norm():
    x = torch.randn(3, 2, 8)
    theta = torch.rand(3, 1, 4) * 6
    cos, sin = torch.cat([theta.cos()] * 2, -1), torch.cat([theta.sin()] * 2, -1)
    out = apply_rope(x, cos, sin)
    # element i pairs with element i + 4 (rotate-half layout), rotated by theta_i
    a, b = x[..., :4], x[..., 4:]
    assert torch.allclose(out[..., :4], a * theta.cos() - b * theta.sin(), atol=1e-6)
    assert torch.allclose(out[..., 4:], b * theta.cos() + a * theta.sin(), atol=1e-6)
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
