// The native CPU ops that other sources of the library call directly (cpu_ops.cpp defines them;
// cpu_step.cpp runs a small decode forward's layers through them in one call).
#pragma once

#include <ATen/ATen.h>

namespace attest_ops {

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                            at::Tensor& pool_k, at::Tensor& pool_v, const at::Tensor& out_slots,
                            const at::Tensor& slots, const at::Tensor& lens, double scale);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);
at::Tensor add_rms_norm(at::Tensor& h, const at::Tensor& y, const at::Tensor& w, double eps);
at::Tensor rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor int4_vnni_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales);
at::Tensor int8_vnni_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales);
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& pool_k,
                            const at::Tensor& pool_v, const at::Tensor& slots,
                            const at::Tensor& prefix, const at::Tensor& starts,
                            const at::Tensor& ext, double scale);
bool extend_attention_built();
at::Tensor decode_layers(at::Tensor& h, const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin, at::TensorList mats, at::TensorList scales,
                         at::IntArrayRef groups, at::TensorList norms, at::TensorList pools,
                         const at::Tensor& out_slots, const at::Tensor& slots,
                         const at::Tensor& lens, at::IntArrayRef dims, double scale, double eps);

}  // namespace attest_ops
