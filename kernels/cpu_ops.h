// The native CPU ops that other sources of the library call directly (cpu_ops.cpp defines them;
// cpu_step.cpp runs a small decode forward's layers through them in one call).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace attest_ops {

// The element helpers every source of the library reads values with.
template <typename T>
inline float f32(T x) {
  return static_cast<float>(x);
}

#if defined(__AVX512F__)
// torch's own vector exp (SLEEF, 1.0 ulp), exported by libtorch_cpu: the one its softmax uses
extern "C" __m512 Sleef_expf16_u10(__m512);

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {  // 16 bfloat16 as float32
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}
#endif

// Whether this process may use AMX's tiles: built for a CPU with them, and Linux hands a process
// the tiles' state only once it asks (arch_prctl; every thread of the process then may use
// them). Asked once; false where the kernel refuses or the library has no tiles.
bool tiles_permitted();

// AMX's tile configuration with all eight tiles 16 rows of 64 bytes (the bfloat16 kernels': an
// A tile 16 rows of 32 bfloat16, a B tile 16 pairs of 16 columns, a C tile 16 x 16 float32).
struct alignas(64) WholeTiles {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                            at::Tensor& pool_k, at::Tensor& pool_v, const at::Tensor& out_slots,
                            const at::Tensor& slots, const at::Tensor& lens, double scale);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);
at::Tensor add_rms_norm(at::Tensor& h, const at::Tensor& y, const at::Tensor& w, double eps);
at::Tensor rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor silu_mul(const at::Tensor& gate_up);
at::Tensor int4_vnni_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales);
at::Tensor int8_vnni_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales);
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& pool_k,
                            const at::Tensor& pool_v, const at::Tensor& slots,
                            const at::Tensor& prefix, const at::Tensor& starts,
                            const at::Tensor& ext, double scale);
bool extend_attention_built();
at::Tensor tile_linear(const at::Tensor& x, const at::Tensor& packed);
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& packed);
bool extend_on_tiles();
bool set_extend_tiles(bool on);
at::Tensor decode_layers(at::Tensor& h, const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin, at::TensorList mats, at::TensorList scales,
                         at::IntArrayRef groups, at::TensorList norms, at::TensorList pools,
                         const at::Tensor& out_slots, const at::Tensor& slots,
                         const at::Tensor& lens, at::IntArrayRef dims, double scale, double eps);
at::Tensor dense_layers(at::Tensor& h, const at::Tensor& x, const at::Tensor& cos,
                        const at::Tensor& sin, at::TensorList mats, int64_t way, bool native_norm,
                        at::TensorList norms, at::TensorList pools, const at::Tensor& out_slots,
                        const at::Tensor& slots, const at::Tensor& lens, at::IntArrayRef dims,
                        double scale, double eps);

// f(A{}, P{}) for the element types of the (activations, pool) dtypes the attention kernels
// take: float32 over float32, bfloat16 over float32, bfloat16 over bfloat16 (the engine's
// NATIVE_DTYPES); an error naming ``op`` for any other pair.
template <typename F>
decltype(auto) by_dtypes(at::ScalarType a, at::ScalarType p, const char* op, F&& f) {
  if (a == at::kFloat && p == at::kFloat) return f(float{}, float{});
  if (a == at::kBFloat16 && p == at::kFloat) return f(c10::BFloat16{}, float{});
  if (a == at::kBFloat16 && p == at::kBFloat16) return f(c10::BFloat16{}, c10::BFloat16{});
  TORCH_CHECK(false, op, ": activations ", a, " with a ", p, " pool");
}

// An attention kernel's instantiation for a head size and a group (query heads a KV head):
// pick(D, G), D and G as std::integral_constant, for head sizes 64 and 128 and groups 1 to 8;
// null elsewhere (the caller's general loops, or another path, run there).
template <typename Fn, typename Pick>
Fn by_shape(int64_t d, int64_t group, Pick pick) {
  auto in_group = [&](auto D) -> Fn {
    switch (group) {
      case 1: return pick(D, std::integral_constant<int, 1>{});
      case 2: return pick(D, std::integral_constant<int, 2>{});
      case 3: return pick(D, std::integral_constant<int, 3>{});
      case 4: return pick(D, std::integral_constant<int, 4>{});
      case 5: return pick(D, std::integral_constant<int, 5>{});
      case 6: return pick(D, std::integral_constant<int, 6>{});
      case 7: return pick(D, std::integral_constant<int, 7>{});
      case 8: return pick(D, std::integral_constant<int, 8>{});
      default: return nullptr;
    }
  };
  if (d == 64) return in_group(std::integral_constant<int, 64>{});
  if (d == 128) return in_group(std::integral_constant<int, 128>{});
  return nullptr;
}

}  // namespace attest_ops
