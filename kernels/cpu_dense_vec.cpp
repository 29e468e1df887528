// Dense products x @ w.T on AVX-512 vectors, their weights laid out once at load: float32 by
// fused multiply-adds, and bfloat16 by AVX-512 BF16's pair products (vdpbf16ps: two products a
// lane, summed into float32) on a CPU that has them and no AMX tiles (cpu_dense.cpp).
//
// The weight [N, K] is laid out in blocks of 32 output columns, each block a stream of K steps
// of 128 bytes: in float32 a step is one k, the block's 32 weights of it ([N / 32, K, 32]); in
// bfloat16 a step is a pair of k, each column's two weights side by side ([N / 32, K / 2, 32,
// 2]). Each thread takes its own blocks; for each block, the rows run up to 12 at a time, a
// row's 32 sums in two registers, the block's weights read from memory by the first rows and
// from the caches by the rest. While a pass computes, its block's steps 64 ahead are fetched
// into L1 and a share of the next block into L2, so memory streams while the arithmetic runs
// (without the next block's fetch, the default model's float32 layers took 8 rows 21.0 ms, 64
// rows 58.1, against 18.6 and 48.9, BENCHMARKS.md). An output's sum runs over the steps in
// order from zero, whatever rows share its step: a row's bits do not depend on its batch.
// oneDNN's and MKL's products sum in other orders, as the ways of engine/model/orient.py
// already do between them. A bfloat16 sum is rounded to bfloat16 once, as c10 rounds, or, for
// the LM head's logits, stored widened to the float32 of that rounding (as the tiles' product
// stores them). A bfloat16 gate/up matrix ([2n, K], gate's rows then up's) can be laid out
// gated, as on the tiles: each block's first 16 columns 16 of gate's, its last the same 16 of
// up's, so that its product (pairs_gated_linear) stores silu(gate) * up as a block's sums leave
// the registers, with silu_mul's bits, and the [rows, 2n] product is never written.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <array>
#include <cstring>
#include <utility>

#include "cpu_ops.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define ATTEST_DENSE_PAIRS 1
#endif

namespace attest_ops {

namespace {

constexpr int64_t kCols = 32;  // output columns a block: two registers of 16
constexpr int kRows = 12;  // rows a step: 24 accumulators, two weight registers
constexpr int64_t kStep = 128;  // bytes of a block's step: its 32 columns' weights of one k, or two

#if defined(__AVX512F__)
// A step's arithmetic for weights of type T: a row's operand of step s (x: the row), and the
// multiply-add of it with 16 columns' weights.
template <typename T>
struct Step;

template <>
struct Step<float> {
  static __m512 operand(const float* x, int64_t s) { return _mm512_set1_ps(x[s]); }
  static __m512 madd(__m512 acc, __m512 a, __m512 w) { return _mm512_fmadd_ps(a, w, acc); }
};

#if defined(ATTEST_DENSE_PAIRS)
template <>
struct Step<c10::BFloat16> {
  static __m512 operand(const c10::BFloat16* x, int64_t s) {
    int pair;
    std::memcpy(&pair, x + 2 * s, 4);
    return _mm512_castsi512_ps(_mm512_set1_epi32(pair));
  }
  static __m512 madd(__m512 acc, __m512 a, __m512 w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)w);
  }
};
#endif

// 16 sums stored as O: float32 as they are; bfloat16 rounded; float32 from bfloat16 (T the
// weights' type, O float) the rounded sums widened.
template <typename T, typename O>
inline void store_sums(O* out, __m512 v) {
  if constexpr (std::is_same_v<O, c10::BFloat16>)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bf16_packed(v));
  else if constexpr (std::is_same_v<T, c10::BFloat16>)
    _mm512_storeu_ps(out, widen16(bf16_packed(v)));
  else
    _mm512_storeu_ps(out, v);
}

// How a block's two registers of sums leave: as its 32 columns of O (Sums), or, gated, as its 16
// columns of silu(gate) * up (Gated). kWidth: the block's columns in the output.
template <typename T, typename O>
struct Sums {
  using Out = O;
  static constexpr int64_t kWidth = kCols;
  inline void operator()(O* out, __m512 a0, __m512 a1, int64_t) const {
    store_sums<T, O>(out, a0);
    store_sums<T, O>(out + 16, a1);
  }
};

#if defined(ATTEST_DENSE_PAIRS)
// Each sum rounded as Sums rounds it, then silu_mul's arithmetic: its table where silu_mul's
// vector loop reaches (the output's columns below vec, whole 64s), its scalar loop past them.
struct Gated {
  using Out = c10::BFloat16;
  static constexpr int64_t kWidth = 16;
  const uint16_t* table;
  int64_t vec;
  inline void operator()(c10::BFloat16* out, __m512 a0, __m512 a1, int64_t col) const {
    gated_store16(out, bf16_packed(a0), widen16(bf16_packed(a1)), table, col < vec);
  }
};
#endif

// Rows [0, R) of x (row stride xs) over block b (w: its steps of 32 columns), into out (row
// stride os; the block's columns from out + b * kWidth) by store.
template <typename T, typename S, int R>
inline void block_rows(const T* x, int64_t xs, const char* w, int64_t steps,
                       typename S::Out* out, int64_t os, const S& store, int64_t b,
                       const char* pf, int64_t pfs) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s) {
    _mm_prefetch(w + (s + 64) * kStep, _MM_HINT_T0);
    _mm_prefetch(w + (s + 64) * kStep + 64, _MM_HINT_T0);
    if (pf != nullptr) {
      _mm_prefetch(pf + s * pfs, _MM_HINT_T1);
      _mm_prefetch(pf + s * pfs + 64, _MM_HINT_T1);
    }
    const __m512 w0 = _mm512_loadu_ps(w + s * kStep), w1 = _mm512_loadu_ps(w + s * kStep + 64);
    for (int r = 0; r < R; ++r) {
      const __m512 a = Step<T>::operand(x + r * xs, s);
      acc[r][0] = Step<T>::madd(acc[r][0], a, w0);
      acc[r][1] = Step<T>::madd(acc[r][1], a, w1);
    }
  }
  const int64_t col = b * S::kWidth;
  for (int r = 0; r < R; ++r) store(out + r * os + col, acc[r][0], acc[r][1], col);
}

template <typename T, typename S>
using BlockFn = void (*)(const T*, int64_t, const char*, int64_t, typename S::Out*, int64_t,
                         const S&, int64_t, const char*, int64_t);

template <typename T, typename S, int... R>
constexpr auto block_table(std::integer_sequence<int, R...>) {
  return std::array<BlockFn<T, S>, sizeof...(R)>{&block_rows<T, S, R + 1>...};
}

// x @ w.T of x [M, K] (row stride xs) on the packed weights ([blocks, steps of kStep bytes]),
// into out [M, blocks * S::kWidth] by store.
template <typename T, typename S>
void vec_product(const T* xp, int64_t xs, int64_t M, const char* wp, int64_t blocks,
                 int64_t steps, typename S::Out* op, const S& store) {
  // block_rows for 1 .. kRows rows
  static constexpr auto kBlock = block_table<T, S>(std::make_integer_sequence<int, kRows>{});
  const int64_t N = blocks * S::kWidth, bytes = steps * kStep;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    const int64_t passes = (M + kRows - 1) / kRows;
    const int64_t share = (bytes / passes + 63) / 64 * 64;  // of the next block, a pass's bytes
    const int64_t pfs = std::max<int64_t>(1, share / steps);
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t g = 0; g < passes; ++g) {
        const int64_t m0 = g * kRows, rows = std::min<int64_t>(kRows, M - m0);
        const char* pf = b + 1 < b1 ? wp + (b + 1) * bytes + g * share : nullptr;
        kBlock[rows - 1](xp + m0 * xs, xs, wp + b * bytes, steps, op + m0 * N, N, store, b, pf,
                         pfs);
      }
  });
}
#endif

}  // namespace

// Whether float32 products can run here: built with AVX-512.
bool dense_f32_built() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

// Whether bfloat16 products can run here: built with AVX-512 BF16.
bool dense_pairs_built() {
#if defined(ATTEST_DENSE_PAIRS)
  return true;
#else
  return false;
#endif
}

// Whether f32_pack takes a weight of this shape: whole blocks of 32 columns.
bool f32_shape(int64_t n, int64_t k) { return n > 0 && k > 0 && n % kCols == 0; }

// Whether pairs_pack takes a weight of this shape: whole blocks of 32 columns, whole pairs of k.
bool pairs_shape(int64_t n, int64_t k) { return f32_shape(n, k) && k % 2 == 0; }

// w [N, K] float32 (N a multiple of 32) laid out for f32_linear: [N / 32, K, 32].
at::Tensor f32_pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.device().is_cpu(),
              "f32_pack: w must be a 2-D float32 CPU tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(f32_shape(N, K), "f32_pack: w is [", N, ", ", K, "]; N must be a multiple of 32");
  return w.reshape({N / kCols, kCols, K}).transpose(1, 2).contiguous();
}

// w [N, K] bfloat16 (N a multiple of 32, K even) laid out for pairs_linear: [N / 32, K / 2, 32,
// 2], each column's weights of k = 2p and 2p + 1 side by side. Gated (w a gate/up matrix, gate's
// N / 2 rows then up's), block b's columns are 16b .. 16b + 15 of gate, then the same of up, for
// pairs_gated_linear.
at::Tensor pairs_pack(const at::Tensor& w, bool gated) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.device().is_cpu(),
              "pairs_pack: w must be a 2-D bfloat16 CPU tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(pairs_shape(N, K), "pairs_pack: w is [", N, ", ", K,
              "]; N must be a multiple of 32 and K even");
  // gated: the rows in the layout's order, [gate's 16, up's same 16] a block
  const at::Tensor rows =
      gated ? w.reshape({2, N / kCols, 16, K}).transpose(0, 1).reshape({N, K}) : w;
  return rows.reshape({N / kCols, kCols, K / 2, 2}).transpose(1, 2).contiguous();
}

namespace {
// The checks both products make: x [M, K] of dtype, dense in its last dimension; packed from
// pack (dim dimensions, its last the block's step) for K.
void check_operands(const char* op, const at::Tensor& x, const at::Tensor& packed,
                    at::ScalarType dtype, int64_t dim, int64_t k_step) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == dtype && x.stride(1) == 1, op,
              ": x must be [M, K] ", dtype == at::kFloat ? "float32" : "bfloat16",
              ", dense in its last dimension");
  TORCH_CHECK(packed.dim() == dim && packed.scalar_type() == dtype && packed.is_contiguous() &&
                  packed.size(2) == kCols,
              op, ": packed must come from its pack");
  TORCH_CHECK(packed.size(1) * k_step == x.size(1), op, ": x has ", x.size(1),
              " columns, the weights ", packed.size(1) * k_step);
}
}  // namespace

// x @ w.T for x [M, K] float32 (rows may be strided, the last dimension dense) and
// packed = f32_pack(w); [M, N] float32.
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(dense_f32_built(), "f32_linear: not built with AVX-512");
  check_operands("f32_linear", x, packed, at::kFloat, 3, 1);
  const int64_t M = x.size(0), blocks = packed.size(0);
  at::Tensor out = at::empty({M, blocks * kCols}, x.options());
#if defined(__AVX512F__)
  if (M > 0)
    vec_product(x.data_ptr<float>(), x.stride(0), M, static_cast<const char*>(packed.data_ptr()),
                blocks, packed.size(1), out.data_ptr<float>(), Sums<float, float>{});
#endif
  return out;
}

// x @ w.T for x [M, K] bfloat16 (rows may be strided, the last dimension dense) and
// packed = pairs_pack(w); [M, N] bfloat16, or with widen the float32 of those bfloat16 sums.
at::Tensor pairs_linear(const at::Tensor& x, const at::Tensor& packed, bool widen) {
  TORCH_CHECK(dense_pairs_built(), "pairs_linear: not built with AVX-512 BF16");
  check_operands("pairs_linear", x, packed, at::kBFloat16, 4, 2);
  const int64_t M = x.size(0), blocks = packed.size(0);
  at::Tensor out =
      at::empty({M, blocks * kCols}, x.options().dtype(widen ? at::kFloat : at::kBFloat16));
#if defined(ATTEST_DENSE_PAIRS)
  if (M > 0) {
    const auto* xp = x.data_ptr<c10::BFloat16>();
    const auto* wp = static_cast<const char*>(packed.data_ptr());
    if (widen)
      vec_product(xp, x.stride(0), M, wp, blocks, packed.size(1), out.data_ptr<float>(),
                  Sums<c10::BFloat16, float>{});
    else
      vec_product(xp, x.stride(0), M, wp, blocks, packed.size(1), out.data_ptr<c10::BFloat16>(),
                  Sums<c10::BFloat16, c10::BFloat16>{});
  }
#endif
  return out;
}

// silu_mul(x @ w.T) for x [M, K] bfloat16 and packed = pairs_pack(w, gated=true) (w a gate/up
// matrix [2n, K]): silu_mul's bits, [M, n] bfloat16.
at::Tensor pairs_gated_linear(const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(dense_pairs_built(), "pairs_gated_linear: not built with AVX-512 BF16");
  check_operands("pairs_gated_linear", x, packed, at::kBFloat16, 4, 2);
  const int64_t M = x.size(0), blocks = packed.size(0), n = blocks * 16;
  at::Tensor out = at::empty({M, n}, x.options());
#if defined(ATTEST_DENSE_PAIRS)
  if (M > 0)
    vec_product(x.data_ptr<c10::BFloat16>(), x.stride(0), M,
                static_cast<const char*>(packed.data_ptr()), blocks, packed.size(1),
                out.data_ptr<c10::BFloat16>(), Gated{silu_bf16_table(), n / 64 * 64});
#endif
  return out;
}

}  // namespace attest_ops

TORCH_LIBRARY_FRAGMENT(attest, m) {
  m.def("dense_f32_built() -> bool", &attest_ops::dense_f32_built);
  m.def("dense_pairs_built() -> bool", &attest_ops::dense_pairs_built);
  m.def("f32_shape(int n, int k) -> bool", &attest_ops::f32_shape);
  m.def("pairs_shape(int n, int k) -> bool", &attest_ops::pairs_shape);
  m.def("f32_pack(Tensor w) -> Tensor");
  m.def("pairs_pack(Tensor w, bool gated=False) -> Tensor");
  m.def("f32_linear(Tensor x, Tensor packed) -> Tensor");
  m.def("pairs_linear(Tensor x, Tensor packed, bool widen=False) -> Tensor");
  m.def("pairs_gated_linear(Tensor x, Tensor packed) -> Tensor");
}

TORCH_LIBRARY_IMPL(attest, CPU, m) {
  m.impl("f32_pack", attest_ops::f32_pack);
  m.impl("pairs_pack", attest_ops::pairs_pack);
  m.impl("f32_linear", attest_ops::f32_linear);
  m.impl("pairs_linear", attest_ops::pairs_linear);
  m.impl("pairs_gated_linear", attest_ops::pairs_gated_linear);
}
