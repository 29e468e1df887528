// A bfloat16 dense product x @ w.T on AMX's bfloat16 tiles, its weights laid out once at load.
//
// The weight [N, K] is laid out in blocks of 32 output columns: for each block and each 32 of
// K, two B tiles of 1 KB (16 pairs of K's elements x 16 columns x the pair), contiguous, so a
// block's column of tiles is one stream. The activations are A tiles as they lie (16 rows of 32
// elements, the row stride the tensor's). Each thread takes its own blocks of columns; for each
// block, every 32 rows run over it as four C tiles (2 x 2: two A tiles, two B tiles a step of K),
// the block's weights in cache while they do. float32 sums, rounded once to bfloat16 (to nearest
// even) as they are stored: the sums of oneDNN's product in another order.
//
// A gate/up matrix ([2n, K], gate's rows then up's) can be laid out gated: each block's first
// B tile 16 of gate's columns, its second the same 16 of up's. Its product (tile_gated_linear)
// then stores silu(gate) * up for those 16 columns as a block's C tiles leave the tiles, as
// silu_mul computes it from the two rounded sums: the MLP's activation without the [rows, 2n]
// product written to memory and read back (at 512 rows, 3 MB a layer each way).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "cpu_ops.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AMX_TILE__) && \
    defined(__AMX_BF16__)
#define ATTEST_DENSE_TILES 1
#endif

namespace attest_ops {

namespace {

constexpr int64_t kCols = 32;  // output columns a block: two B tiles
constexpr int64_t kDepth = 32;  // K a tile step: one bfloat16 tile row
constexpr int64_t kStep = 2 * 16 * kDepth;  // bfloat16 elements of a block's tiles a step

#if defined(ATTEST_DENSE_TILES)
// 16 of a C tile's float32 sums rounded once to bfloat16 (to nearest even), as every way of
// storing the product rounds them
inline __m256i rounded16(const float* c) { return (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(c)); }

// The first rows of block b's C tiles (c: [32][32] float32) as bfloat16 into out's rows (from
// out, its row stride os): the block's 32 columns.
struct StoreSums {
  inline void operator()(const float (*c)[kCols], int64_t rows, c10::BFloat16* out, int64_t os,
                         int64_t b) const {
    out += b * kCols;
    for (int64_t r = 0; r < rows; ++r) {
      auto* o = reinterpret_cast<__m256i*>(out + r * os);
      _mm256_storeu_si256(o, rounded16(c[r]));
      _mm256_storeu_si256(o + 1, rounded16(c[r] + 16));
    }
  }
};

// StoreSums's sums rounded to bfloat16 as it rounds them, stored widened to float32: the same
// numbers as the bfloat16 product's .float(), without the bfloat16 product in memory.
struct StoreWidened {
  inline void operator()(const float (*c)[kCols], int64_t rows, float* out, int64_t os,
                         int64_t b) const {
    out += b * kCols;
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < 2; ++h)
        _mm512_storeu_ps(out + r * os + 16 * h, widen16(rounded16(c[r] + 16 * h)));
  }
};

// A gated block's 16 columns of silu(gate) * up: each sum rounded as StoreSums rounds it, then
// silu_mul's arithmetic, its vector loop's where the columns lie in it (below the last whole 64
// of n, ``vec``), else its scalar loop's.
struct StoreGated {
  const uint16_t* table;
  int64_t vec;
  inline void operator()(const float (*c)[kCols], int64_t rows, c10::BFloat16* out, int64_t os,
                         int64_t b) const {
    out += b * 16;
    for (int64_t r = 0; r < rows; ++r)
      gated_store16(out + r * os, rounded16(c[r]), widen16(rounded16(c[r] + 16)), table,
                    b * 16 < vec);
  }
};

// Which of a step's tiles are loaded with the hint that they will not be used again soon
// (TILELOADDT1), so that they do not push the others out of L1 (see tile_blocks): none, the B
// tiles (the weights), or the A tiles (the rows).
enum class Stream { none, weights, rows };

// Tile t from p (rows `stride` bytes apart), as a stream or not. A macro: the tile intrinsics
// take their tile's number as a literal.
#define ATTEST_LOAD_TILE(t, stream, p, stride) \
  do {                                         \
    if constexpr (stream)                      \
      _tile_stream_loadd(t, p, stride);        \
    else                                       \
      _tile_loadd(t, p, stride);               \
  } while (0)

// The product of 32 rows (a, row stride as bytes; 16 of them when one) over one block's column
// of tiles (w), into c: four C tiles (two with one).
template <bool one, Stream stream>
inline void block_rows(const uint16_t* a, int64_t as, const uint16_t* w, int64_t steps,
                       float (*c)[kCols]) {
  constexpr bool rows = stream == Stream::rows, weights = stream == Stream::weights;
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (!one) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t s = 0; s < steps; ++s) {
    ATTEST_LOAD_TILE(4, rows, a + s * kDepth, as);
    ATTEST_LOAD_TILE(6, weights, w + s * kStep, 64);
    ATTEST_LOAD_TILE(7, weights, w + s * kStep + kStep / 2, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (!one) {
      ATTEST_LOAD_TILE(5, rows, a + 16 * as / 2 + s * kDepth, as);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, &c[0][0], kCols * 4);
  _tile_stored(1, &c[0][16], kCols * 4);
  if constexpr (!one) {
    _tile_stored(2, &c[16][0], kCols * 4);
    _tile_stored(3, &c[16][16], kCols * 4);
  }
}

// block_rows for `rows` rows (32 or fewer): two C tiles for 16 or fewer, four past them.
template <Stream stream>
inline void block_of(const uint16_t* a, int64_t as, const uint16_t* w, int64_t steps,
                     int64_t rows, float (*c)[kCols]) {
  if (rows <= 16)
    block_rows<true, stream>(a, as, w, steps, c);
  else
    block_rows<false, stream>(a, as, w, steps, c);
}

constexpr int64_t kChunkBytes = 256 * 1024;  // a run of blocks' weights held in L2
constexpr int64_t kFewRows = 64;  // up to these rows, a block at a time

// Column blocks [b0, b1) of x @ w.T: x [M, K] (row stride xs; K a multiple of 32), the layout's
// blocks, out [M, N] (row stride os), each block's C tiles leaving by ``store``. The blocks in
// runs whose weights fit L2, every 32 rows over a run while its weights are there, their A
// tiles kept in L1 across the run's blocks by
// loading the B tiles as a stream (without the hint a block's B tiles, as many bytes as its 32
// rows' A tiles at every K, pushed them out); up to kFewRows rows, a block at a time, the
// weights one stream from memory: with more than 32 rows the rows' A tiles are loaded as the
// stream instead, so that the block's B tiles stay in L1 for its second 32 rows (the weights
// as the stream cost 64 rows 8-13 %). Over the default model's 30 layers the two hints took
// 512 rows 56.0-58.8 ms against 64.2-68.2 without, 64 rows 15.1-15.7 against 15.8-16.5
// (BENCHMARKS.md); a block at a time against runs at 64 rows: 13.97 ms against 15.04 before
// either hint.
template <typename Out, typename Store>
void tile_blocks(const uint16_t* x, int64_t xs, int64_t M, int64_t K, const uint16_t* packed,
                 Out* out, int64_t os, int64_t b0, int64_t b1, const Store& store) {
  const int64_t steps = K / kDepth;
  alignas(64) float c[2 * 16][kCols];
  // the rows past M's last whole 32, zeros below them: a tile's 16 rows always read
  const int64_t whole = M / 32 * 32, tail = M - whole;
  std::vector<uint16_t> pad(tail > 0 ? 32 * K : 0, 0);
  for (int64_t r = 0; r < tail; ++r)
    std::memcpy(pad.data() + r * K, x + (whole + r) * xs, K * sizeof(uint16_t));
  const bool few = M <= kFewRows;
  const int64_t run = few ? 1 : std::max<int64_t>(1, kChunkBytes / (steps * kStep * 2));
  for (int64_t r0 = b0; r0 < b1; r0 += run) {
    const int64_t r1 = std::min(b1, r0 + run);
    for (int64_t m0 = 0; m0 < M; m0 += 32) {
      const bool last = m0 == whole;
      const uint16_t* a = last ? pad.data() : x + m0 * xs;
      const int64_t as = (last ? K : xs) * 2, rows = std::min<int64_t>(32, M - m0);
      for (int64_t b = r0; b < r1; ++b) {
        const uint16_t* w = packed + b * steps * kStep;
        if (!few)  // runs: the rows' tiles stay in L1 across the run's blocks
          block_of<Stream::weights>(a, as, w, steps, rows, c);
        else if (M > 32)  // two passes: the block's weights stay in L1 for the second
          block_of<Stream::rows>(a, as, w, steps, rows, c);
        else  // one pass: the rows' tiles stay in L1 across the blocks as they are
          block_of<Stream::none>(a, as, w, steps, rows, c);
        store(c, rows, out + m0 * os, os, b);
      }
    }
  }
}
#endif

}  // namespace

// Whether bfloat16 products can run on AMX's tiles here: built for them, and permitted.
bool dense_tiles_built() {
#if defined(ATTEST_DENSE_TILES)
  return tiles_permitted();
#else
  return false;
#endif
}

// Whether tile_pack takes a weight of this shape: whole blocks of 32 columns and steps of 32.
bool tile_shape(int64_t n, int64_t k) { return n > 0 && k > 0 && n % kCols == 0 && k % kDepth == 0; }

// w [N, K] bfloat16 (N and K multiples of 32) laid out for tile_linear: [N / 32, K / 32, 2, 16,
// 32]. Within a block's step, tile t holds columns 16t .. 16t + 15, its row p the pairs (K = 2p,
// 2p + 1) of each column, as a B tile's rows are read. Gated (w a gate/up matrix, gate's N / 2
// rows then up's), block b's tile t holds columns 16b .. 16b + 15 of gate (t = 0) or of up, for
// tile_gated_linear.
at::Tensor tile_pack(const at::Tensor& w, bool gated) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.device().is_cpu(),
              "tile_pack: w must be a 2-D bfloat16 CPU tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(tile_shape(N, K), "tile_pack: w is [", N, ", ", K, "]; both must be multiples of 32");
  const int64_t blocks = N / kCols, steps = K / kDepth;
  at::Tensor out = at::empty({blocks, steps, 2, 16, 2 * 16}, w.options());
  const at::Tensor wc = w.contiguous();
  const auto* src = reinterpret_cast<const uint16_t*>(wc.data_ptr());
  auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t s = 0; s < steps; ++s)
        for (int64_t t = 0; t < 2; ++t)
          for (int64_t p = 0; p < 16; ++p)
            for (int64_t j = 0; j < 16; ++j)
              for (int64_t e = 0; e < 2; ++e) {
                const int64_t col = gated ? t * (N / 2) + 16 * b + j : b * kCols + 16 * t + j;
                const int64_t k = s * kDepth + 2 * p + e;
                dst[(((b * steps + s) * 2 + t) * 16 + p) * 32 + 2 * j + e] = src[col * K + k];
              }
  });
  return out;
}

#if defined(ATTEST_DENSE_TILES)
namespace {

// The product on packed = tile_pack(w, gated) over x [M, K] (bfloat16, rows may be strided, the
// last dimension dense) into a new [M, block_cols x blocks] tensor, each block's C tiles leaving
// by ``store``.
template <typename Out, typename Store>
at::Tensor tile_product(const at::Tensor& x, const at::Tensor& packed, const char* op,
                        int64_t block_cols, const Store& store) {
  TORCH_CHECK(dense_tiles_built(), op, ": no AMX bfloat16 tiles here");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1, op,
              ": x must be [M, K] bfloat16, dense in its last dimension");
  TORCH_CHECK(packed.dim() == 5 && packed.scalar_type() == at::kBFloat16 &&
                  packed.is_contiguous() && packed.size(2) == 2 && packed.size(3) == 16 &&
                  packed.size(4) == 32,
              op, ": packed must come from tile_pack");
  const int64_t M = x.size(0), K = x.size(1), blocks = packed.size(0), N = blocks * block_cols;
  TORCH_CHECK(packed.size(1) * kDepth == K, op, ": x has ", K, " columns, the weights ",
              packed.size(1) * kDepth);
  at::Tensor out = at::empty({M, N}, x.options().dtype(c10::CppTypeToScalarType<Out>::value));
  if (M == 0) return out;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  auto* o = out.data_ptr<Out>();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    const WholeTiles cfg;  // 0 to 3 C, 4 and 5 A, 6 and 7 B
    _tile_loadconfig(&cfg);
    tile_blocks(xp, x.stride(0), M, K, wp, o, N, b0, b1, store);
    _tile_release();
  });
  return out;
}

}  // namespace
#endif

// x @ w.T for x [M, K] bfloat16 (rows may be strided, the last dimension dense) and
// packed = tile_pack(w); [M, N] bfloat16, or widened, the same numbers in float32.
at::Tensor tile_linear(const at::Tensor& x, const at::Tensor& packed, bool widen) {
#if defined(ATTEST_DENSE_TILES)
  if (widen) return tile_product<float>(x, packed, "tile_linear", kCols, StoreWidened{});
  return tile_product<c10::BFloat16>(x, packed, "tile_linear", kCols, StoreSums{});
#else
  TORCH_CHECK(false, "tile_linear: no AMX bfloat16 tiles here");
#endif
}

// silu(gate) * up of x's product with a gate/up matrix w [2n, K], for packed = tile_pack(w,
// gated=true): silu_mul(x @ w.T)'s bits, [M, n] bfloat16.
at::Tensor tile_gated_linear(const at::Tensor& x, const at::Tensor& packed) {
#if defined(ATTEST_DENSE_TILES)
  const int64_t n = packed.dim() == 5 ? packed.size(0) * 16 : 0;
  return tile_product<c10::BFloat16>(x, packed, "tile_gated_linear", 16,
                                     StoreGated{silu_bf16_table(), n / 64 * 64});
#else
  TORCH_CHECK(false, "tile_gated_linear: no AMX bfloat16 tiles here");
#endif
}

}  // namespace attest_ops

TORCH_LIBRARY_FRAGMENT(attest, m) {
  m.def("dense_tiles_built() -> bool", &attest_ops::dense_tiles_built);
  m.def("tile_shape(int n, int k) -> bool", &attest_ops::tile_shape);
  m.def("tile_pack(Tensor w, bool gated=False) -> Tensor");
  m.def("tile_linear(Tensor x, Tensor packed, bool widen=False) -> Tensor");
  m.def("tile_gated_linear(Tensor x, Tensor packed) -> Tensor");
}

TORCH_LIBRARY_IMPL(attest, CPU, m) {
  m.impl("tile_pack", attest_ops::tile_pack);
  m.impl("tile_linear", attest_ops::tile_linear);
  m.impl("tile_gated_linear", attest_ops::tile_gated_linear);
}
