// One call for all the layers of a small decode forward (fast mode, a few rows): the operations
// engine/model/llama.py's forward runs for each layer, in its order, through the same kernels:
// torch's packed int8 / int4 products (at::_weight_int8pack_mm, _weight_int4pack_mm_for_cpu)
// or the integer ones of cpu_int.cpp, whichever the matrices were packed for, the native rope,
// decode attention and norms of cpu_ops.cpp, torch's SiLU and product. Only the Python between
// them is gone (at one stream a step runs about 15 ops a layer, each a few microseconds of
// Python dispatch), so the result has the Python forward's bits.

#include <ATen/ATen.h>

#include "cpu_ops.h"

namespace attest_ops {

namespace {

// x @ w.T by a packed matrix, as QuantWeight.packed_matmul: the integer products' int4 or int8
// layout (4 dimensions, cpu_int.cpp), int8 values ([out, in], per-row scales) or torch's int4
// packing (scales and zeros per group of ``group`` input columns).
at::Tensor packed_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                     int64_t group) {
  if (packed.dim() == 4)
    return packed.scalar_type() == at::kChar ? int8_vnni_mm(x, packed, scales)
                                             : int4_vnni_mm(x, packed, scales);
  if (packed.scalar_type() == at::kChar) return at::_weight_int8pack_mm(x, packed, scales);
  return at::_weight_int4pack_mm_for_cpu(x, packed, group, scales);
}

}  // namespace

// h, x: [T, hidden], the residual stream (updated in place) and the first layer's normed input;
// per layer l, mats / scales / groups [4l .. 4l+3]: QKV, O, gate-up, down; norms [2l, 2l+1]: the
// layer's MLP norm and the norm after it (the next layer's input norm, or the final one);
// pools [2l, 2l+1]: its K and V pools. dims: heads, kv_heads, head_dim. Returns the last norm's
// output, as the forward does.
at::Tensor decode_layers(at::Tensor& h, const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin, at::TensorList mats, at::TensorList scales,
                         at::IntArrayRef groups, at::TensorList norms, at::TensorList pools,
                         const at::Tensor& out_slots, const at::Tensor& slots,
                         const at::Tensor& lens, at::IntArrayRef dims, double scale, double eps) {
  const int64_t layers = static_cast<int64_t>(norms.size()) / 2;
  TORCH_CHECK(norms.size() % 2 == 0 && mats.size() == 4 * norms.size() / 2 &&
                  scales.size() == mats.size() && groups.size() == mats.size() &&
                  pools.size() == norms.size(),
              "decode_layers: 4 matrices, 2 norms and 2 pools a layer");
  TORCH_CHECK(dims.size() == 3, "decode_layers: dims are heads, kv_heads, head_dim");
  TORCH_CHECK(h.is_contiguous() && h.sizes() == x.sizes() && x.dim() == 2,
              "decode_layers: h and x [T, hidden], h contiguous");
  const int64_t T = x.size(0), heads = dims[0], kv_heads = dims[1], d = dims[2];
  const int64_t q_size = heads * d, kv_size = kv_heads * d;
  at::Tensor cur = x;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t m = 4 * l;
    at::Tensor qkv = packed_mm(cur, mats[m], scales[m], groups[m]);
    TORCH_CHECK(qkv.size(1) == q_size + 2 * kv_size, "decode_layers: QKV width of layer ", l);
    at::Tensor qk = qkv.narrow(1, 0, q_size + kv_size).view({T, heads + kv_heads, d});
    rope_(qk, cos, sin);
    at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({T, kv_heads, d});
    at::Tensor pool_k = pools[2 * l], pool_v = pools[2 * l + 1];
    at::Tensor attn = decode_attention(qk.narrow(1, 0, heads), qk.narrow(1, heads, kv_heads), v,
                                       pool_k, pool_v, out_slots, slots, lens, scale);
    at::Tensor o = packed_mm(attn.view({T, q_size}), mats[m + 1], scales[m + 1], groups[m + 1]);
    cur = add_rms_norm(h, o, norms[2 * l], eps);
    at::Tensor gate_up = packed_mm(cur, mats[m + 2], scales[m + 2], groups[m + 2]);
    auto halves = gate_up.chunk(2, -1);
    at::Tensor act = at::silu(halves[0]).mul_(halves[1]);
    at::Tensor down = packed_mm(act, mats[m + 3], scales[m + 3], groups[m + 3]);
    cur = add_rms_norm(h, down, norms[2 * l + 1], eps);
  }
  return cur;
}

}  // namespace attest_ops
