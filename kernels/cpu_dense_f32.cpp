// A float32 dense product x @ w.T on AVX-512's fused multiply-adds, its weights laid out once at
// load.
//
// The weight [N, K] is laid out in blocks of 32 output columns, each block its K rows of 32
// ([N / 32, K, 32]): a block is one stream of K * 128 bytes. Each thread takes its own blocks;
// for each block, the rows run up to 12 at a time, a row's 32 sums in two registers, the
// block's weights read from memory by the first rows and from the caches by the rest. While a
// pass computes, its block's rows 64 ahead are fetched into L1 and a share of the next block
// into L2, so memory streams while the arithmetic runs (without the next block's fetch, the
// default model's layers took 8 rows 21.0 ms, 64 rows 58.1, against 18.6 and 48.9,
// BENCHMARKS.md). An output's sum runs over k = 0 .. K - 1 in order, one fused
// multiply-add at a time from zero, whatever rows share its step: a row's bits do not depend
// on its batch. oneDNN's and MKL's products sum in other orders, as the ways of
// engine/model/orient.py already do between them.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <array>
#include <utility>

#include "cpu_ops.h"

namespace attest_ops {

namespace {

constexpr int64_t kCols = 32;  // output columns a block: two registers of 16
constexpr int kRows = 12;  // rows a step: 24 accumulators, two weight registers

#if defined(__AVX512F__)
// Rows [0, R) of x (row stride xs) over one block (w: K rows of 32), into out (row stride os).
template <int R>
inline void block_rows(const float* x, int64_t xs, const float* w, int64_t K, float* out,
                       int64_t os, const char* pf, int64_t pfs) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(w + (k + 64) * kCols), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + (k + 64) * kCols + 16), _MM_HINT_T0);
    if (pf != nullptr) {
      _mm_prefetch(pf + k * pfs, _MM_HINT_T1);
      _mm_prefetch(pf + k * pfs + 64, _MM_HINT_T1);
    }
    const __m512 w0 = _mm512_loadu_ps(w + k * kCols), w1 = _mm512_loadu_ps(w + k * kCols + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * xs + k]);
      acc[r][0] = _mm512_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + r * os, acc[r][0]);
    _mm512_storeu_ps(out + r * os + 16, acc[r][1]);
  }
}

using BlockFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t,
                        const char*, int64_t);

template <int... R>
constexpr auto block_table(std::integer_sequence<int, R...>) {
  return std::array<BlockFn, sizeof...(R)>{&block_rows<R + 1>...};
}

// block_rows for 1 .. kRows rows
constexpr auto kBlock = block_table(std::make_integer_sequence<int, kRows>{});
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

// Whether f32_pack takes a weight of this shape: whole blocks of 32 columns.
bool f32_shape(int64_t n, int64_t k) { return n > 0 && k > 0 && n % kCols == 0; }

// w [N, K] float32 (N a multiple of 32) laid out for f32_linear: [N / 32, K, 32].
at::Tensor f32_pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.device().is_cpu(),
              "f32_pack: w must be a 2-D float32 CPU tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(f32_shape(N, K), "f32_pack: w is [", N, ", ", K, "]; N must be a multiple of 32");
  return w.reshape({N / kCols, kCols, K}).transpose(1, 2).contiguous();
}

// x @ w.T for x [M, K] float32 (rows may be strided, the last dimension dense) and
// packed = f32_pack(w); [M, N] float32.
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(dense_f32_built(), "f32_linear: not built with AVX-512");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1,
              "f32_linear: x must be [M, K] float32, dense in its last dimension");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kFloat &&
                  packed.is_contiguous() && packed.size(2) == kCols,
              "f32_linear: packed must come from f32_pack");
  const int64_t M = x.size(0), K = x.size(1), blocks = packed.size(0), N = blocks * kCols;
  TORCH_CHECK(packed.size(1) == K, "f32_linear: x has ", K, " columns, the weights ",
              packed.size(1));
  at::Tensor out = at::empty({M, N}, x.options());
#if defined(__AVX512F__)
  if (M == 0) return out;
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xs = x.stride(0);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    const int64_t passes = (M + kRows - 1) / kRows, bytes = K * kCols * 4;
    const int64_t share = (bytes / passes + 63) / 64 * 64;  // of the next block, a pass's bytes
    const int64_t pfs = std::max<int64_t>(1, share / K);
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t g = 0; g < passes; ++g) {
        const int64_t m0 = g * kRows, rows = std::min<int64_t>(kRows, M - m0);
        const char* pf = b + 1 < b1 ? reinterpret_cast<const char*>(wp + (b + 1) * K * kCols) +
                                          g * share
                                    : nullptr;
        kBlock[rows - 1](xp + m0 * xs, xs, wp + b * K * kCols, K, op + m0 * N + b * kCols, N,
                         pf, pfs);
      }
  });
#endif
  return out;
}

}  // namespace attest_ops

TORCH_LIBRARY_FRAGMENT(attest, m) {
  m.def("dense_f32_built() -> bool", &attest_ops::dense_f32_built);
  m.def("f32_shape(int n, int k) -> bool", &attest_ops::f32_shape);
  m.def("f32_pack(Tensor w) -> Tensor");
  m.def("f32_linear(Tensor x, Tensor packed) -> Tensor");
}

TORCH_LIBRARY_IMPL(attest, CPU, m) {
  m.impl("f32_pack", attest_ops::f32_pack);
  m.impl("f32_linear", attest_ops::f32_linear);
}
