// Integer products for fast mode's int4 matrices on CPUs with VNNI (AVX-512 VNNI): x @ w.T with
// the activations quantised to 8 bits per group of 32 columns and the dot products in integers
// (vpdpbusd: per int32 lane, 4 unsigned 4-bit weights times 4 signed 8-bit activations).
//
// The weights are the int4 values of engine/model/quant.py (w ~= q * scale + lo, q in [0, 15],
// one scale and one lo per group of 32 input columns), laid out at load by
// engine/model/int4_vnni.py, in blocks of 16 output rows (a lane each):
//   packed [N / 16, G, 4, 64] uint8: per block and group, four vectors of 16 lanes x 4 bytes; in
//     vector j, lane r's byte b holds q[r, 8j + b] in its low nibble and q[r, 8j + 4 + b] in its
//     high one (columns within the group);
//   scales [N / 16, G, 2, 16] bfloat16: per block and group, the 16 rows' scales, then their lo's.
// A vector of weights meets 4 activations broadcast to every lane, so the 16 lanes are 16 output
// rows and no sum across lanes is needed.
//
// Per activation row and group g: d = max |x| / 127, a = round(x / d) in [-127, 127], and
//   y[n] = sum_g (scale[n, g] * d_g) * sum(q * a) + lo[n, g] * (d_g * sum(a)),
// the integer sums exact, the float ones in a fixed order: a row's result does not depend on the
// other rows of the product.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__)
#define ATTEST_INT4_VNNI 1
#include <immintrin.h>
#endif

namespace attest_ops {

namespace {

constexpr int64_t kGroup = 32, kRows = 16, kBlockBytes = 4 * 64;

// Activation rows, quantised: a [rows, K]; d and dsum [rows, G] (dsum = d * sum(a)). Buffers of
// the calling thread, kept between calls (a product takes microseconds; allocating is not free).
struct QuantRows {
  std::vector<int8_t> a;
  std::vector<float> d, dsum;
};

template <typename X>
void quantise_rows(const X* x, int64_t rows, int64_t K, QuantRows& r) {
  const int64_t G = K / kGroup;
  r.a.assign(rows * K, 0);
  r.d.assign(rows * G, 0.f);
  r.dsum.assign(rows * G, 0.f);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t g = 0; g < G; ++g) {
      const X* xg = x + t * K + g * kGroup;
      float amax = 0.f;
      for (int64_t k = 0; k < kGroup; ++k) amax = std::max(amax, std::fabs(static_cast<float>(xg[k])));
      if (amax == 0.f) continue;
      const float inv = 127.f / amax;
      int8_t* ag = r.a.data() + t * K + g * kGroup;
      int32_t sum = 0;
      for (int64_t k = 0; k < kGroup; ++k) {
        const float v = std::nearbyint(static_cast<float>(xg[k]) * inv);
        ag[k] = static_cast<int8_t>(std::max(-127.f, std::min(127.f, v)));
        sum += ag[k];
      }
      r.d[t * G + g] = amax / 127.f;
      r.dsum[t * G + g] = r.d[t * G + g] * static_cast<float>(sum);
    }
  }
}

#ifdef ATTEST_INT4_VNNI

inline __m512 bf16x16(const uint16_t* p) {  // 16 bfloat16 as float32
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m512i bcast4(const int8_t* p) {  // 4 activations to every lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Blocks [b0, b0 + B) of 16 output rows for the T (1..4) quantised activation rows:
// out[t * N + n], in Y (float or bfloat16).
template <int T, int B, typename Y>
void blocks_vnni(const uint8_t* packed, const uint16_t* scales, int64_t N, int64_t K,
                 const QuantRows& xs, Y* out, int64_t b0) {
  const int64_t G = K / kGroup;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512 acc[B][T];
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) acc[b][t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i dot[B][T];  // B * T chains of integer sums, independent of each other
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) dot[b][t] = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      __m512i xl[T], xh[T];
      for (int t = 0; t < T; ++t) {
        const int8_t* at = xs.a.data() + t * K + g * kGroup + 8 * j;
        xl[t] = bcast4(at);
        xh[t] = bcast4(at + 4);
      }
      for (int b = 0; b < B; ++b) {
        const uint8_t* wb = packed + ((b0 + b) * G + g) * kBlockBytes + j * 64;
        const __m512i v = _mm512_loadu_si512(wb);
        const __m512i low = _mm512_and_si512(v, nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        for (int t = 0; t < T; ++t) {
          dot[b][t] = _mm512_dpbusd_epi32(dot[b][t], low, xl[t]);
          dot[b][t] = _mm512_dpbusd_epi32(dot[b][t], high, xh[t]);
        }
      }
    }
    for (int b = 0; b < B; ++b) {
      const uint16_t* sb = scales + ((b0 + b) * G + g) * 2 * kRows;
      const __m512 scale = bf16x16(sb), lo = bf16x16(sb + kRows);
      for (int t = 0; t < T; ++t) {
        const __m512 sd = _mm512_mul_ps(scale, _mm512_set1_ps(xs.d[t * G + g]));
        acc[b][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[b][t]), sd, acc[b][t]);
        acc[b][t] = _mm512_fmadd_ps(lo, _mm512_set1_ps(xs.dsum[t * G + g]), acc[b][t]);
      }
    }
  }
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      alignas(64) float y[kRows];
      _mm512_store_ps(y, acc[b][t]);
      Y* o = out + t * N + (b0 + b) * kRows;
      for (int r = 0; r < kRows; ++r) o[r] = static_cast<Y>(y[r]);
    }
}

// Blocks [begin, end) in runs of B, the rest one at a time.
template <int T, int B, typename Y>
void run_vnni(const uint8_t* packed, const uint16_t* scales, int64_t N, int64_t K,
              const QuantRows& xs, Y* out, int64_t begin, int64_t end) {
  int64_t b = begin;
  for (; b + B <= end; b += B) blocks_vnni<T, B>(packed, scales, N, K, xs, out, b);
  for (; b < end; ++b) blocks_vnni<T, 1>(packed, scales, N, K, xs, out, b);
}

#endif

}  // namespace

bool int4_vnni_built() {
#ifdef ATTEST_INT4_VNNI
  return true;
#else
  return false;
#endif
}

// x [T, K] (float32 or bfloat16) @ w.T for w laid out as above; the result in x's dtype.
at::Tensor int4_vnni_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  TORCH_CHECK(int4_vnni_built(), "int4_vnni_mm: built for a CPU without AVX-512 VNNI");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 4 && scales.dim() == 4,
              "int4_vnni_mm: x [T, K], packed [N/16, K/32, 4, 64], scales [N/16, K/32, 2, 16]");
  TORCH_CHECK(packed.scalar_type() == at::kByte && scales.scalar_type() == at::kBFloat16,
              "int4_vnni_mm: packed uint8, scales bfloat16");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "int4_vnni_mm: x float32 or bfloat16");
  const int64_t T = x.size(0), K = x.size(1), blocks = packed.size(0), N = blocks * kRows;
  TORCH_CHECK(K % kGroup == 0 && packed.size(1) == K / kGroup && packed.size(2) == 4 &&
                  packed.size(3) == 64,
              "int4_vnni_mm: x has ", K, " columns, the matrix ", packed.size(1) * kGroup);
  TORCH_CHECK(scales.size(0) == blocks && scales.size(1) == K / kGroup && scales.size(2) == 2 &&
                  scales.size(3) == kRows,
              "int4_vnni_mm: scales [", blocks, ", ", K / kGroup, ", 2, 16]");
  const at::Tensor xc = x.contiguous(), pc = packed.contiguous(), sc = scales.contiguous();
  at::Tensor out = at::empty({T, N}, xc.options());
#ifdef ATTEST_INT4_VNNI
  const uint8_t* pw = pc.data_ptr<uint8_t>();
  const auto* ps = reinterpret_cast<const uint16_t*>(sc.data_ptr<at::BFloat16>());
  thread_local QuantRows mine;
  QuantRows& xs = mine;  // the calling thread's: the workers below read it by this reference
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, xc.scalar_type(), "int4_vnni_mm", [&] {
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
      const int rows = static_cast<int>(std::min<int64_t>(4, T - t0));
      quantise_rows(xc.data_ptr<scalar_t>() + t0 * K, rows, K, xs);
      scalar_t* po = out.data_ptr<scalar_t>() + t0 * N;
      at::parallel_for(0, blocks, 4, [&](int64_t b0, int64_t b1) {
        switch (rows) {  // about eight chains of integer sums in flight
          case 1: run_vnni<1, 4>(pw, ps, N, K, xs, po, b0, b1); break;
          case 2: run_vnni<2, 4>(pw, ps, N, K, xs, po, b0, b1); break;
          case 3: run_vnni<3, 2>(pw, ps, N, K, xs, po, b0, b1); break;
          default: run_vnni<4, 2>(pw, ps, N, K, xs, po, b0, b1);
        }
      });
    }
  });
#endif
  return out;
}

}  // namespace attest_ops

TORCH_LIBRARY_FRAGMENT(attest, m) {
  m.def("int4_vnni_mm(Tensor x, Tensor packed, Tensor scales) -> Tensor");
  m.def("int4_vnni_built() -> bool", &attest_ops::int4_vnni_built);
}

TORCH_LIBRARY_IMPL(attest, CPU, m) { m.impl("int4_vnni_mm", attest_ops::int4_vnni_mm); }
