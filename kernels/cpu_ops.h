// The native CPU ops that other sources of the library call directly (cpu_ops.cpp defines them;
// cpu_step.cpp runs a small decode forward's layers through them in one call).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <string>
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

// silu(g) * u in T as torch's scalar loop computes it: the silu rounded to T, then the product
template <typename T>
inline T silu_times(float g, float u) {
  return static_cast<T>(static_cast<float>(static_cast<T>(g / (1.f + std::exp(-g)))) * u);
}

#if defined(__AVX512F__)
// torch's own vector exp (SLEEF, 1.0 ulp), exported by libtorch_cpu: the one its softmax uses
extern "C" __m512 Sleef_expf16_u10(__m512);

// 16 bfloat16 (their bits) as float32: each the high half of its lane
inline __m512 widen16(__m256i x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {  // 16 bfloat16 as float32
  return widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// v rounded to bfloat16 as c10 rounds (to nearest even; a NaN is 0x7fc0), in each lane's low half
inline __m512i bf16_bits(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan, _mm512_set1_epi32(0x7fc0));
}
// The same 16 roundings packed: on a CPU with AVX-512 BF16 by its conversion, which rounds as
// c10 does save for two kinds of lane, read first: a denormal (the instruction reads it as zero)
// and a NaN (it keeps the payload); a vector with either takes the integer rounding above. At
// 512 bfloat16 rows the residual add and norm took 77-84 us so against 96-99, rope 66-71
// against 80-81 (BENCHMARKS.md).
inline __m256i bf16_packed(__m512 v) {
#if defined(__AVX512BF16__)
  constexpr int kOdd = 0x01 | 0x20 | 0x80;  // quiet NaN, denormal, signalling NaN
  if (_mm512_fpclass_ps_mask(v, kOdd) == 0) return (__m256i)_mm512_cvtneps_pbh(v);
#endif
  return _mm512_cvtepi32_epi16(bf16_bits(v));
}

// silu(g) = g / (1 + exp(-g)) rounded to bfloat16 for every bfloat16 g, by its bits (cpu_ops.cpp)
const uint16_t* silu_bf16_table();

// silu(g) * u rounded to bfloat16 for 16 bfloat16 gates (their bits) and their up values (as
// float32): the silu by the table, then the product rounded, as silu_mul's vector loop
inline __m256i silu_times16(__m256i g, __m512 u, const uint16_t* table) {
  const __m512i got = _mm512_i32gather_epi32(_mm512_cvtepu16_epi32(g), table, 2);
  return bf16_packed(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(got, 16)), u));
}

// A gated product's 16 columns of silu(g) * u into out (g, u as silu_times16 takes them): by
// silu_mul's vector loop where the columns lie in it (``vec``: below the last whole 64 of n),
// else by its scalar loop, so the bits are silu_mul's either way.
inline void gated_store16(c10::BFloat16* out, __m256i g, __m512 u, const uint16_t* table,
                          bool vec) {
  if (vec) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), silu_times16(g, u, table));
    return;
  }
  alignas(32) c10::BFloat16 gs[16];
  alignas(64) float us[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(gs), g);
  _mm512_store_ps(us, u);
  for (int j = 0; j < 16; ++j) out[j] = silu_times<c10::BFloat16>(f32(gs[j]), us[j]);
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
at::Tensor tile_linear(const at::Tensor& x, const at::Tensor& packed, bool widen = false);
at::Tensor tile_gated_linear(const at::Tensor& x, const at::Tensor& packed);
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& packed);
at::Tensor pairs_linear(const at::Tensor& x, const at::Tensor& packed, bool widen = false);
at::Tensor pairs_gated_linear(const at::Tensor& x, const at::Tensor& packed);
std::string extend_way();
std::string set_extend_way(const std::string& name);
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
