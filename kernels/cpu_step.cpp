// One call for all the layers of a small decode forward (fast mode, a few rows): the operations
// engine/model/llama.py's forward runs for each layer, in its order, through the same kernels:
// torch's packed int8 / int4 products (at::_weight_int8pack_mm, _weight_int4pack_mm_for_cpu)
// or the integer ones of cpu_int.cpp, whichever the matrices were packed for, the native rope,
// decode attention and norms of cpu_ops.cpp, torch's SiLU and product. Only the Python between
// them is gone (at one stream a step runs about 15 ops a layer, each a few microseconds of
// Python dispatch), so the result has the Python forward's bits. Exact mode in bfloat16 runs its
// dense products the same way (dense_layers): the one of linear's three ways its rows take.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

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

// The layers' loop both calls share: product(cur, l, j) is ``cur`` times layer l's matrix j
// (QKV, O, gate-up, down), gated(cur, l) silu(gate) * up of its product with the gate-up
// matrix; add_norm(h, y, w) adds y into h, in place, and returns the norm of
// the new h. h, x: [T, hidden], the residual stream (updated in place) and the
// first layer's normed input; norms [2l, 2l+1]: the layer's MLP norm and the norm after it (the
// next layer's input norm, or the final one); pools [2l, 2l+1]: its K and V pools. dims: heads,
// kv_heads, head_dim. Returns the last norm's output, as the forward does.
template <typename Product, typename Gated, typename AddNorm>
at::Tensor layers_loop(at::Tensor& h, const at::Tensor& x, const at::Tensor& cos,
                       const at::Tensor& sin, int64_t matrices, at::TensorList norms,
                       at::TensorList pools, const at::Tensor& out_slots, const at::Tensor& slots,
                       const at::Tensor& lens, at::IntArrayRef dims, double scale,
                       const char* op, Product product, Gated gated, AddNorm add_norm) {
  const int64_t layers = static_cast<int64_t>(norms.size()) / 2;
  TORCH_CHECK(norms.size() % 2 == 0 && matrices == 4 * layers && pools.size() == norms.size(),
              op, ": 4 matrices, 2 norms and 2 pools a layer");
  TORCH_CHECK(dims.size() == 3, op, ": dims are heads, kv_heads, head_dim");
  TORCH_CHECK(h.is_contiguous() && h.sizes() == x.sizes() && x.dim() == 2, op,
              ": h and x [T, hidden], h contiguous");
  const int64_t T = x.size(0), heads = dims[0], kv_heads = dims[1], d = dims[2];
  const int64_t q_size = heads * d, kv_size = kv_heads * d;
  at::Tensor cur = x;
  for (int64_t l = 0; l < layers; ++l) {
    at::Tensor qkv = product(cur, l, 0);
    TORCH_CHECK(qkv.size(1) == q_size + 2 * kv_size, op, ": QKV width of layer ", l);
    at::Tensor qk = qkv.narrow(1, 0, q_size + kv_size).view({T, heads + kv_heads, d});
    rope_(qk, cos, sin);
    at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({T, kv_heads, d});
    at::Tensor pool_k = pools[2 * l], pool_v = pools[2 * l + 1];
    at::Tensor attn = decode_attention(qk.narrow(1, 0, heads), qk.narrow(1, heads, kv_heads), v,
                                       pool_k, pool_v, out_slots, slots, lens, scale);
    at::Tensor o = product(attn.view({T, q_size}), l, 1);
    cur = add_norm(h, o, norms[2 * l]);
    at::Tensor act = gated(cur, l);
    cur = add_norm(h, product(act, l, 3), norms[2 * l + 1]);
  }
  return cur;
}

// add_rms_norm's arithmetic by torch's ops, as engine/model/fused.py's add_norm runs them (the
// sum is written into h: the same values as the new tensor there)
at::Tensor torch_add_norm(at::Tensor& h, const at::Tensor& y, const at::Tensor& w, double eps) {
  h.add_(y);
  at::Tensor xf = h.to(at::kFloat);
  xf = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return w * xf.to(h.scalar_type());
}

}  // namespace

// Fast mode: per layer l, mats / scales / groups [4l .. 4l+3], each matrix packed (packed_mm).
at::Tensor decode_layers(at::Tensor& h, const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin, at::TensorList mats, at::TensorList scales,
                         at::IntArrayRef groups, at::TensorList norms, at::TensorList pools,
                         const at::Tensor& out_slots, const at::Tensor& slots,
                         const at::Tensor& lens, at::IntArrayRef dims, double scale, double eps) {
  TORCH_CHECK(scales.size() == mats.size() && groups.size() == mats.size(),
              "decode_layers: a scale and a group a matrix");
  auto product = [&](const at::Tensor& cur, int64_t l, int64_t j) {
    const int64_t m = 4 * l + j;
    return packed_mm(cur, mats[m], scales[m], groups[m]);
  };
  auto gated = [&](const at::Tensor& cur, int64_t l) { return silu_mul(product(cur, l, 2)); };
  auto add_norm = [&](at::Tensor& hh, const at::Tensor& y, const at::Tensor& w) {
    return add_rms_norm(hh, y, w, eps);
  };
  return layers_loop(h, x, cos, sin, static_cast<int64_t>(mats.size()), norms, pools, out_slots,
                     slots, lens, dims, scale, "decode_layers", product, gated, add_norm);
}

// Dense products (exact mode's, fast mode's dense values): every product the one way ``way``
// that engine/model/llama.py's linear takes at these rows (orient.py): 0 F.linear, 1 (w @ x.T).T
// laid out by rows (one row padded to two), 2 on weights packed at load: the native product on
// AMX's tiles, the native float32 one or the native bfloat16 one on vectors where they are laid
// out for it, else oneDNN's linear.
// mats: per layer l [4l .. 4l+3], the dense matrices ([out, in]) or, way 2, their packed copies
// (a gate-up matrix's gated for the tiles or the bfloat16 product on vectors: its one product the
// gated one).
// native_norm: the native add and norm (bfloat16), else torch's ops (float32: transformers' bits).
at::Tensor dense_layers(at::Tensor& h, const at::Tensor& x, const at::Tensor& cos,
                        const at::Tensor& sin, at::TensorList mats, int64_t way, bool native_norm,
                        at::TensorList norms, at::TensorList pools, const at::Tensor& out_slots,
                        const at::Tensor& slots, const at::Tensor& lens, at::IntArrayRef dims,
                        double scale, double eps) {
  TORCH_CHECK(way >= 0 && way <= 2, "dense_layers: way 0 (linear), 1 (mm) or 2 (packed)");
  auto product = [&](const at::Tensor& cur, int64_t l, int64_t j) -> at::Tensor {
    const at::Tensor& w = mats[4 * l + j];
    if (way == 0) return at::linear(cur, w);
    if (way == 1) {
      if (cur.size(0) == 1)
        return at::mm(w, at::cat({cur, at::zeros_like(cur)}).t()).narrow(1, 0, 1).t().contiguous();
      return at::mm(w, cur.t()).t().contiguous();
    }
    if (w.dim() == 5) return tile_linear(cur, w);  // laid out for AMX's tiles (cpu_dense.cpp)
    if (w.dim() == 3) return f32_linear(cur, w);  // for the float32 product (cpu_dense_vec.cpp)
    if (w.dim() == 4) return pairs_linear(cur, w);  // for the bfloat16 one on vectors (the same)
    // looked up once, where a packed copy exists: torch has oneDNN (orient.py's pack)
    static const c10::OperatorHandle packed_linear =
        c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
    torch::jit::Stack stack{cur, w, c10::IValue(), std::string("none"),
                            c10::List<std::optional<at::Scalar>>(), std::string("")};
    packed_linear.callBoxed(&stack);
    return stack[0].toTensor();
  };
  // a gate-up matrix laid out for the tiles or the bfloat16 product on vectors is laid out gated
  // (orient.py's pack): its product is the activation itself
  auto gated = [&](const at::Tensor& cur, int64_t l) {
    const at::Tensor& w = mats[4 * l + 2];
    if (way == 2 && w.dim() == 5) return tile_gated_linear(cur, w);
    if (way == 2 && w.dim() == 4) return pairs_gated_linear(cur, w);  // on vectors, likewise
    return silu_mul(product(cur, l, 2));
  };
  auto add_norm = [&](at::Tensor& hh, const at::Tensor& y, const at::Tensor& w) {
    return native_norm ? add_rms_norm(hh, y, w, eps) : torch_add_norm(hh, y, w, eps);
  };
  return layers_loop(h, x, cos, sin, static_cast<int64_t>(mats.size()), norms, pools, out_slots,
                     slots, lens, dims, scale, "dense_layers", product, gated, add_norm);
}

}  // namespace attest_ops
