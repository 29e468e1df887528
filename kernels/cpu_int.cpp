// Integer products for fast mode's int4 and int8 matrices on CPUs with AVX-512 VNNI: x @ w.T
// with the activations quantised to 8 bits per group of 32 columns and the dot products in
// integers (vpdpbusd: per int32 lane, 4 unsigned bytes times 4 signed bytes, summed).
//
// The weights are the values of engine/model/quant.py, laid out at load by
// engine/model/int_vnni.py in blocks of 16 output rows (a vector lane each). A vector of weights
// meets 4 activations broadcast to every lane, so the 16 lanes are 16 output rows and no sum
// across lanes is needed.
//
// int4 (w ~= q * scale + lo, q in [0, 15], a scale and a lo per group of 32 input columns):
//   packed [N / 16, G, 4, 64] uint8: per block and group, four vectors of 16 lanes x 4 bytes; in
//     vector j, lane r's byte b holds q[r, 8j + b] in its low nibble and q[r, 8j + 4 + b] in its
//     high one (columns within the group);
//   scales [N / 16, G, 2, 16] bfloat16: per block and group, the 16 rows' scales, then their lo's;
//   y[n] = sum_g (scale[n, g] * d_g) * sum(q * a) + lo[n, g] * (d_g * sum(a)).
// int8 (w ~= q * scale, q in [-127, 127], a scale per row): the activations are the unsigned
// operand, a + 128, and 128 * sum(q) over the group is taken off again;
//   packed [N / 16, G, 8, 64] int8: vector j, lane r's byte b holds q[r, 4j + b];
//   scales [N / 16, G + 1, 16] float32: per block, each group's 128 * sum(q) (an integer, exact
//     in float32), then the rows' scales;
//   y[n] = scale[n] * sum_g d_g * (sum((a + 128) * q) - 128 * sum(q)).
// Per activation row and group g: d = max |x| / 127, a = round(x / d) in [-127, 127]. The integer
// sums are exact, the float ones in a fixed order: a row's result does not depend on the other
// rows of the product.
//
// On a CPU with AMX's int8 tiles an int8 product of more rows runs on them instead (int8_tiles):
// a group's 8 x 64 bytes of a block are one B tile as they lie (4 columns of 16 rows a tile row,
// the layout above), 16 activation rows' 32 bytes of the group one A tile, and one tile product
// (signed times signed) gives every row's integer sum with the block's 16 rows. Each sum is the
// vector kernel's integer (exact either way), scaled and added in the same order, so a row's bits
// are the same whichever runs.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu_ops.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__)
#define ATTEST_INT_VNNI 1
#include <immintrin.h>
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define ATTEST_INT_TILES 1
#endif
#endif

namespace attest_ops {

namespace {

constexpr int64_t kGroup = 32, kRows = 16;

// A matrix as the kernels take it.
struct Mat {
  const void* w;
  const void* s;
  int64_t N, K;
};

// Activation rows, quantised: a [rows, K]; d and dsum [rows, G] (dsum = d * sum(a)). Buffers of
// the calling thread, kept between calls (a product takes microseconds; allocating is not free).
struct QuantRows {
  std::vector<int8_t> a;
  std::vector<float> d, dsum;
};

// Up to four of those rows, from row ``t0``: what one run of the blocks reads.
struct RowSpan {
  const int8_t* a;
  const float *d, *dsum;
  RowSpan(const QuantRows& r, int64_t t0, int64_t K)
      : a(r.a.data() + t0 * K),
        d(r.d.data() + t0 * (K / kGroup)),
        dsum(r.dsum.data() + t0 * (K / kGroup)) {}
};

#ifdef ATTEST_INT_VNNI

inline __m512i bcast4(const int8_t* p) {  // 4 activations to every lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// One group of 32 activations: a = round(x * (127 / max |x|)) in [-127, 127] (to nearest, ties
// to even: the conversion's default rounding), d = max |x| / 127, dsum = d * sum(a); a group
// with a NaN or an infinity gets d = dsum = NaN (its row's products are NaN, as in floats), one
// of zeros d = dsum = 0. ``ag`` comes zeroed.
template <typename X>
inline void quantise_group(const X* xg, int8_t* ag, float& d, float& dsum) {
  const __m512 v0 = load16(xg), v1 = load16(xg + 16);
  constexpr int kNotFinite = 0x01 | 0x08 | 0x10 | 0x80;  // quiet NaN, +inf, -inf, signalling NaN
  if (_mm512_fpclass_ps_mask(v0, kNotFinite) | _mm512_fpclass_ps_mask(v1, kNotFinite)) {
    d = dsum = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  if (amax == 0.f) {
    d = dsum = 0.f;
    return;
  }
  const __m512 inv = _mm512_set1_ps(127.f / amax);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m512i r0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));
  const __m512i r1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
  const __m512i q0 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, r0));
  const __m512i q1 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, r1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(ag), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(ag + 16), _mm512_cvtepi32_epi8(q1));
  d = amax / 127.f;
  dsum = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
}

template <typename X>
void quantise_rows(const X* x, int64_t rows, int64_t K, QuantRows& r) {
  const int64_t G = K / kGroup;
  const int64_t whole = (rows + kRows - 1) / kRows * kRows;  // whole tiles of 16 rows, zeros past
  r.a.assign(whole * K, 0);
  r.d.assign(whole * G, 0.f);
  r.dsum.resize(rows * G);
  // rows shared among the threads from 16,384 values a thread (fewer: one thread is quicker)
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / K), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t g = 0; g < G; ++g)
        quantise_group(x + t * K + g * kGroup, r.a.data() + t * K + g * kGroup, r.d[t * G + g],
                       r.dsum[t * G + g]);
  });
}

template <typename Y>
inline void store_rows(__m512 y, Y* out) {  // 16 lanes to 16 outputs, in Y
  alignas(64) float v[kRows];
  _mm512_store_ps(v, y);
  for (int r = 0; r < kRows; ++r) out[r] = static_cast<Y>(v[r]);
}

template <typename V, int B, int T>
inline void zero(V (&v)[B][T], V z) {  // accumulators and sums of a run of blocks
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) v[b][t] = z;
}

// Blocks [b0, b0 + B) of 16 output rows for the T (1..4) quantised activation rows:
// out[t * N + n], in Y (float or bfloat16). B * T chains of integer sums, independent.
template <int T, int B, typename Y>
struct Int4Blocks {
  static void run(const Mat& m, const RowSpan& xs, Y* out, int64_t b0) {
    const int64_t G = m.K / kGroup;
    const auto* packed = static_cast<const uint8_t*>(m.w);
    const auto* scales = static_cast<const c10::BFloat16*>(m.s);
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    __m512 acc[B][T];
    zero(acc, _mm512_setzero_ps());
    for (int64_t g = 0; g < G; ++g) {
      __m512i dot[B][T];
      zero(dot, _mm512_setzero_si512());
      for (int j = 0; j < 4; ++j) {
        __m512i xl[T], xh[T];
        for (int t = 0; t < T; ++t) {
          const int8_t* at = xs.a + t * m.K + g * kGroup + 8 * j;
          xl[t] = bcast4(at);
          xh[t] = bcast4(at + 4);
        }
        for (int b = 0; b < B; ++b) {
          const __m512i v = _mm512_loadu_si512(packed + ((b0 + b) * G + g) * 256 + j * 64);
          const __m512i low = _mm512_and_si512(v, nibble);
          const __m512i high = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
          for (int t = 0; t < T; ++t) {
            dot[b][t] = _mm512_dpbusd_epi32(dot[b][t], low, xl[t]);
            dot[b][t] = _mm512_dpbusd_epi32(dot[b][t], high, xh[t]);
          }
        }
      }
      for (int b = 0; b < B; ++b) {
        const c10::BFloat16* sb = scales + ((b0 + b) * G + g) * 2 * kRows;
        const __m512 scale = load16(sb), lo = load16(sb + kRows);
        for (int t = 0; t < T; ++t) {
          const __m512 sd = _mm512_mul_ps(scale, _mm512_set1_ps(xs.d[t * G + g]));
          acc[b][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[b][t]), sd, acc[b][t]);
          acc[b][t] = _mm512_fmadd_ps(lo, _mm512_set1_ps(xs.dsum[t * G + g]), acc[b][t]);
        }
      }
    }
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) store_rows(acc[b][t], out + t * m.N + (b0 + b) * kRows);
  }
};

template <int T, int B, typename Y>
struct Int8Blocks {
  static void run(const Mat& m, const RowSpan& xs, Y* out, int64_t b0) {
    const int64_t G = m.K / kGroup;
    const auto* packed = static_cast<const int8_t*>(m.w);
    const auto* scales = static_cast<const float*>(m.s);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));  // a + 128, as unsigned
    __m512 acc[B][T];
    zero(acc, _mm512_setzero_ps());
    for (int64_t g = 0; g < G; ++g) {
      __m512i dot[B][T];
      zero(dot, _mm512_setzero_si512());
      for (int j = 0; j < 8; ++j) {
        __m512i xa[T];
        for (int t = 0; t < T; ++t)
          xa[t] = _mm512_xor_si512(bcast4(xs.a + t * m.K + g * kGroup + 4 * j), flip);
        for (int b = 0; b < B; ++b) {
          const __m512i w = _mm512_loadu_si512(packed + ((b0 + b) * G + g) * 512 + j * 64);
          for (int t = 0; t < T; ++t) dot[b][t] = _mm512_dpbusd_epi32(dot[b][t], xa[t], w);
        }
      }
      for (int b = 0; b < B; ++b) {
        const __m512 bias = _mm512_loadu_ps(scales + ((b0 + b) * (G + 1) + g) * kRows);
        for (int t = 0; t < T; ++t) {
          const __m512 sum = _mm512_sub_ps(_mm512_cvtepi32_ps(dot[b][t]), bias);  // exact
          acc[b][t] = _mm512_fmadd_ps(sum, _mm512_set1_ps(xs.d[t * G + g]), acc[b][t]);
        }
      }
    }
    for (int b = 0; b < B; ++b) {
      const __m512 rs = _mm512_loadu_ps(scales + ((b0 + b) * (G + 1) + G) * kRows);
      for (int t = 0; t < T; ++t)
        store_rows(_mm512_mul_ps(acc[b][t], rs), out + t * m.N + (b0 + b) * kRows);
    }
  }
};

#ifdef ATTEST_INT_TILES

// The tiles' shapes: 0, 1 A (16 activation rows x a group's 32 bytes), 2, 3 B (a block's group:
// 8 rows of 64 bytes), 4 to 7 C (16 rows x 16 int32): two groups in flight, and two more
// stored while the next two run.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {32, 32, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 8, 8, 16, 16, 16, 16};
};

// acc[r] += float(c[r]) * d[r * G] for the 16 rows of a C tile stored at c: the vector kernel's
// sum (its integer, exact in float32) scaled and added as it does.
inline void scale_rows(const int32_t (*c)[kRows], const float* d, int64_t G, __m512* acc) {
  for (int r = 0; r < kRows; ++r) {  // all 16, the rows past the product's zeros: in registers
    const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(c[r]));
    acc[r] = _mm512_fmadd_ps(sum, _mm512_set1_ps(d[r * G]), acc[r]);
  }
}

// One group's integer sums into tile C: the activations' 32 bytes of 16 rows (a, rows K apart)
// into tile A, the block's group (w, 512 bytes) into tile B, their product (signed times signed).
// A macro: the tile intrinsics take their tiles' numbers as literals.
#define ATTEST_GROUP_SUMS(C, A, B, a, K, w) \
  do {                                       \
    _tile_loadd(A, a, K);                    \
    _tile_loadd(B, w, 64);                   \
    _tile_zero(C);                           \
    _tile_dpbssd(C, A, B);                   \
  } while (0)

// x @ w.T for an int8 matrix on the tiles: the T quantised rows (xs, whole tiles of 16 rows)
// against the blocks of 16 output rows, the blocks shared among the threads; a block's groups
// (its 9 KB for 576 columns) stay in cache while every 16 rows run over them.
constexpr int64_t kAhead = 4;  // blocks ahead whose weights are fetched

template <typename Y>
void int8_tiles(const Mat& m, const QuantRows& xs, int64_t T, Y* out) {
  const int64_t K = m.K, N = m.N, G = K / kGroup, blocks = N / kRows;
  const auto* packed = static_cast<const int8_t*>(m.w);
  const auto* scales = static_cast<const float*>(m.s);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    const TileConfig cfg;
    _tile_loadconfig(&cfg);
    alignas(64) int32_t c[2][2][kRows][kRows];  // two pairs of groups' sums
    for (int64_t b = b0; b < b1; ++b) {
      const int8_t* wb = packed + b * G * 512;
      const __m512 rs = _mm512_loadu_ps(scales + (b * (G + 1) + G) * kRows);
      // the weights kAhead blocks on, fetched into L2 a pair of groups at a time while this block
      // runs: the tile loads alone leave the memory's latency unhidden
      const char* ahead =
          b + kAhead < b1 ? reinterpret_cast<const char*>(wb + kAhead * G * 512) : nullptr;
      for (int64_t t0 = 0; t0 < T; t0 += kRows) {
        const int M = static_cast<int>(std::min<int64_t>(kRows, T - t0));
        const int8_t* a = xs.a.data() + t0 * K;
        const float* d = xs.d.data() + t0 * G;
        __m512 acc[kRows];
        for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
        // groups in pairs, each pair's sums stored while the next pair's products run and
        // scaled after them: a tile's store is not read back at once
        const int64_t pairs = (G + 1) / 2;
        for (int64_t p = 0; p <= pairs; ++p) {
          const int64_t g = 2 * p;
          int32_t (*cs)[kRows][kRows] = c[p % 2];
          if (p < pairs) {
            if (ahead != nullptr && t0 == 0)
              for (int64_t off = g * 512; off < std::min(g + 2, G) * 512; off += 64)
                _mm_prefetch(ahead + off, _MM_HINT_T1);
            if (p % 2)
              ATTEST_GROUP_SUMS(6, 0, 2, a + g * kGroup, K, wb + g * 512);
            else
              ATTEST_GROUP_SUMS(4, 0, 2, a + g * kGroup, K, wb + g * 512);
            if (g + 1 < G) {
              if (p % 2)
                ATTEST_GROUP_SUMS(7, 1, 3, a + (g + 1) * kGroup, K, wb + (g + 1) * 512);
              else
                ATTEST_GROUP_SUMS(5, 1, 3, a + (g + 1) * kGroup, K, wb + (g + 1) * 512);
            }
          }
          if (p > 0) {  // the previous pair's sums
            int32_t (*ps)[kRows][kRows] = c[(p - 1) % 2];
            scale_rows(ps[0], d + g - 2, G, acc);
            if (g - 1 < G) scale_rows(ps[1], d + g - 1, G, acc);
          }
          if (p < pairs) {
            if (p % 2) {
              _tile_stored(6, cs[0], 64);
              if (g + 1 < G) _tile_stored(7, cs[1], 64);
            } else {
              _tile_stored(4, cs[0], 64);
              if (g + 1 < G) _tile_stored(5, cs[1], 64);
            }
          }
        }
        for (int r = 0; r < M; ++r) store_rows(_mm512_mul_ps(acc[r], rs), out + (t0 + r) * N + b * kRows);
      }
    }
    _tile_release();
  });
}

#endif

// Products of at least this many rows run on the tiles where they are built and permitted: from
// 8 (below it the vector kernel is as fast or faster: a tile product costs the same for 1 row as
// for 16), or never where ATTEST_INT_TILES=0 (to measure against); set_int8_tiles_from changes it.
constexpr int64_t kTilesFrom = 8;
std::atomic<int64_t>& tiles_from() {
  static std::atomic<int64_t> from{[] {
    const char* off = std::getenv("ATTEST_INT_TILES");
    return off != nullptr && std::string(off) == "0" ? int64_t{0} : kTilesFrom;
  }()};
  return from;
}

bool tiles_ready() {
#ifdef ATTEST_INT_TILES
  return tiles_permitted();  // cpu_ops.h
#else
  return false;
#endif
}

// Blocks [begin, end) in runs of B, the rest one at a time.
template <template <int, int, typename> class Blocks, int T, int B, typename Y>
void span(const Mat& m, const RowSpan& xs, Y* out, int64_t begin, int64_t end) {
  int64_t b = begin;
  for (; b + B <= end; b += B) Blocks<T, B, Y>::run(m, xs, out, b);
  for (; b < end; ++b) Blocks<T, 1, Y>::run(m, xs, out, b);
}

// x @ w.T: the rows quantised once, the blocks of output rows shared among the threads in one
// parallel region; each thread takes its blocks a tile at a time and runs every four activation
// rows over a tile while its weights are in cache (one pass over the matrix from memory, not one
// per four rows).
template <template <int, int, typename> class Blocks>
at::Tensor run_int(const at::Tensor& x, const Mat& m, bool tiles = false) {
  const at::Tensor xc = x.contiguous();
  const int64_t T = xc.size(0), K = m.K, N = m.N, blocks = N / kRows;
  at::Tensor out = at::empty({T, N}, xc.options());
  thread_local QuantRows mine;
  QuantRows& xs = mine;  // the calling thread's: the workers below read it by this reference
  auto go = [&](auto* x0, auto* o0) {  // float32 or bfloat16, in and out (checked before)
    quantise_rows(x0, T, K, xs);
#ifdef ATTEST_INT_TILES
    if (tiles) return int8_tiles(m, xs, T, o0);
#endif
    at::parallel_for(0, blocks, 4, [&](int64_t b0, int64_t b1) {
      // more than four rows: tiles of 8 blocks (128 output rows of K weights, in L2), each run
      // by every four rows before the next; four rows or fewer: the thread's blocks in one run
      const int64_t tile = T > 4 ? 8 : b1 - b0;
      for (int64_t c0 = b0; c0 < b1; c0 += tile) {
        const int64_t c1 = std::min(b1, c0 + tile);
        for (int64_t t0 = 0; t0 < T; t0 += 4) {
          const RowSpan rs(xs, t0, K);
          auto* po = o0 + t0 * N;
          switch (std::min<int64_t>(4, T - t0)) {  // about eight chains of integer sums in flight
            case 1: span<Blocks, 1, 4>(m, rs, po, c0, c1); break;
            case 2: span<Blocks, 2, 4>(m, rs, po, c0, c1); break;
            case 3: span<Blocks, 3, 2>(m, rs, po, c0, c1); break;
            default: span<Blocks, 4, 2>(m, rs, po, c0, c1);
          }
        }
      }
    });
  };
  if (xc.scalar_type() == at::kFloat)
    go(xc.data_ptr<float>(), out.data_ptr<float>());
  else
    go(xc.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>());
  return out;
}

#endif

}  // namespace

bool int_vnni_built() {
#ifdef ATTEST_INT_VNNI
  return true;
#else
  return false;
#endif
}

namespace {

// A layout's tensors: packed [N / 16, K / 32, vectors, 64] of packed_t, scales of scales_t in
// the shape scales_shape gives; the message says them all.
struct Layout {
  const char* op;
  int64_t vectors;
  at::ScalarType packed_t, scales_t;
  const char* tensors;
};

std::vector<int64_t> scales_shape(const Layout& l, int64_t blocks, int64_t G) {
  if (l.vectors == 4) return {blocks, G, 2, kRows};  // int4: scales, then lo's
  return {blocks, G + 1, kRows};                     // int8: 128 * sum(q) per group, row scales
}

Mat checked(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
            const Layout& l) {
  TORCH_CHECK(int_vnni_built(), l.op, ": built for a CPU without AVX-512 VNNI");
  TORCH_CHECK(x.dim() == 2, l.op, ": x [T, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, l.op,
              ": x float32 or bfloat16");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == l.packed_t &&
                  scales.scalar_type() == l.scales_t && packed.is_contiguous() &&
                  scales.is_contiguous(),
              l.op, ": ", l.tensors, ", contiguous");
  const int64_t K = x.size(1), blocks = packed.size(0);
  TORCH_CHECK(K % kGroup == 0 && packed.size(1) == K / kGroup && packed.size(2) == l.vectors &&
                  packed.size(3) == 64,
              l.op, ": x has ", K, " columns, the matrix ", packed.size(1) * kGroup);
  const std::vector<int64_t> want = scales_shape(l, blocks, K / kGroup);
  TORCH_CHECK(scales.sizes() == at::IntArrayRef(want), l.op, ": scales ", at::IntArrayRef(want),
              ", not ", scales.sizes());
  return {packed.data_ptr(), scales.data_ptr(), blocks * kRows, K};
}

}  // namespace

// x [T, K] (float32 or bfloat16) @ w.T for an int4 matrix laid out as above; in x's dtype.
at::Tensor int4_vnni_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  const Mat m = checked(x, packed, scales, {"int4_vnni_mm", 4, at::kByte, at::kBFloat16,
      "packed [N/16, K/32, 4, 64] uint8, scales [N/16, K/32, 2, 16] bfloat16"});
#ifdef ATTEST_INT_VNNI
  return run_int<Int4Blocks>(x, m);
#else
  return at::Tensor();
#endif
}

// x [T, K] (float32 or bfloat16) @ w.T for an int8 matrix laid out as above; in x's dtype.
at::Tensor int8_vnni_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  const Mat m = checked(x, packed, scales, {"int8_vnni_mm", 8, at::kChar, at::kFloat,
      "packed [N/16, K/32, 8, 64] int8, scales [N/16, K/32 + 1, 16] float32"});
#ifdef ATTEST_INT_VNNI
  const int64_t from = tiles_from().load();
  return run_int<Int8Blocks>(x, m, from > 0 && x.size(0) >= from && tiles_ready());
#else
  return at::Tensor();
#endif
}

// Whether int8 products can run on AMX's tiles here: built for them, and Linux lets this
// process use them.
bool int8_tiles_built() { return tiles_ready(); }

// From how many rows an int8 product runs on the tiles (0: never); returns the bound it replaces.
int64_t set_int8_tiles_from(int64_t rows) {
  TORCH_CHECK(rows >= 0, "set_int8_tiles_from: rows must be 0 or more, not ", rows);
  return tiles_from().exchange(rows);
}

// From how many rows an int8 product runs on the tiles (0: never), where int8_tiles_built.
int64_t int8_tiles_from() { return tiles_ready() ? tiles_from().load() : 0; }

}  // namespace attest_ops

TORCH_LIBRARY_FRAGMENT(attest, m) {
  m.def("int4_vnni_mm(Tensor x, Tensor packed, Tensor scales) -> Tensor");
  m.def("int8_vnni_mm(Tensor x, Tensor packed, Tensor scales) -> Tensor");
  m.def("int_vnni_built() -> bool", &attest_ops::int_vnni_built);
  m.def("int8_tiles_built() -> bool", &attest_ops::int8_tiles_built);
  m.def("set_int8_tiles_from(int rows) -> int", &attest_ops::set_int8_tiles_from);
  m.def("int8_tiles_from() -> int", &attest_ops::int8_tiles_from);
}

TORCH_LIBRARY_IMPL(attest, CPU, m) {
  m.impl("int4_vnni_mm", attest_ops::int4_vnni_mm);
  m.impl("int8_vnni_mm", attest_ops::int8_vnni_mm);
}
