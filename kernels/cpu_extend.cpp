// Attention of a prefill chunk (an extend) over the paged pool, for head sizes 64 and 128 on
// AVX-512: each new token attends to its request's context up to itself, read from the pool
// where it lies. The flash method: keys sixteen at a time, a running max and sum per query, the
// output rescaled as the max grows, so no score matrix is ever held.
//
// A work item is sixteen consecutive queries of one request and one KV head (with its G query
// heads). For each block of sixteen keys the item turns the keys into columns once (D rows of
// sixteen floats, in L1), so eight queries' sixteen scores are D steps of one load and eight
// multiply-adds of a broadcast query value, with no sum across lanes; the block's V rows are
// made float once and met by a few queries' accumulators held in registers. Float32 inside;
// the output rounded once to the activations' dtype.
//
// A bfloat16 chunk over a bfloat16 pool of at least sixteen new tokens runs the laid-out method
// instead (below), where the CPU has bfloat16 dot products: its request's context laid out once,
// the scores taken transposed so that the softmax runs lane-wise over sixteen queries. On a CPU
// with AMX's bfloat16 tiles the scores and the weighted sum of V are tile products ("tiles");
// elsewhere the same products run as AVX-512 BF16 pair products on vectors ("pairs"). The
// extend_way switch says which runs ("loops": the items above, for every chunk).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_ops.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define ATTEST_EXTEND_LAID 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define ATTEST_EXTEND_TILES 1
#endif
#endif

namespace attest_ops {

namespace {

// How a bfloat16 chunk of at least kLaidRows new tokens over a bfloat16 pool runs: the items'
// loops, the laid-out method on vectors, or on the tiles (the most the CPU can run, unless
// ATTEST_EXTEND_WAY names a lesser one; set_extend_way changes it).
enum Way : int { kLoops = 0, kPairs = 1, kTiles = 2 };
constexpr const char* kWayNames[] = {"loops", "pairs", "tiles"};

int way_of(const std::string& name) {
  for (int w = kLoops; w <= kTiles; ++w)
    if (name == kWayNames[w]) return w;
  return -1;
}

// The most this CPU and build can run.
int best_way() {
#if defined(ATTEST_EXTEND_TILES)
  if (tiles_permitted()) return kTiles;
#endif
#if defined(ATTEST_EXTEND_LAID)
  return kPairs;
#else
  return kLoops;
#endif
}

std::atomic<int>& way_chosen() {
  static std::atomic<int> chosen{[] {
    const char* env = std::getenv("ATTEST_EXTEND_WAY");
    if (env == nullptr || *env == '\0') return static_cast<int>(kTiles);
    const int w = way_of(env);
    TORCH_CHECK(w >= 0, "ATTEST_EXTEND_WAY must be loops, pairs or tiles, got '", env, "'");
    return w;
  }()};
  return chosen;
}

int way_now() { return std::min(way_chosen().load(), best_way()); }

}  // namespace

#if defined(__AVX512F__)
namespace {

constexpr int kKeys = 16, kQueries = 16;  // a block of keys; an item's positions
constexpr int kTile = 8;                  // queries scored together

template <typename A, typename P, int D, int G>
void extend_item(const A* q, int64_t qs0, int64_t qs1, const P* pk, const P* pv, int64_t kvh,
                 int64_t h, const int64_t* srow, int64_t ss1, int64_t prefix, int64_t j0,
                 int64_t nq, float scale, A* out, int64_t os0, int64_t os1) {
  constexpr int C = D / 16, U = (kQueries * G + kTile - 1) / kTile * kTile;
  constexpr int UQ = 16 / C;  // queries whose accumulators meet a V row together
  static_assert(U % UQ == 0, "the p * V tiles cover the queries");
  const float ninf = -std::numeric_limits<float>::infinity();
  // query u = r * G + g: position j0 + r, head h * G + g; rows past nq * G are zeros, unused
  alignas(64) float qf[U][D];
  alignas(64) float acc[U][D];
  alignas(64) float sc[U][kKeys];  // scores, then weights
  float m[U], l[U], alpha[U];
  int64_t pos[U];
  alignas(64) float kt[D][kKeys];  // the block's keys as columns
#if defined(__AVX512BF16__)
  // bfloat16 activations and pool: the keys' columns as pairs of bfloat16 (one 32-bit lane a key
  // and two dimensions), met by the unscaled queries' pairs in vdpbf16ps; the scale after
  constexpr bool pairs = std::is_same_v<A, c10::BFloat16> && std::is_same_v<P, c10::BFloat16>;
  alignas(64) uint32_t kt2[pairs ? D / 2 : 1][kKeys];
  alignas(64) uint32_t qp[pairs ? U : 1][pairs ? D / 2 : 1];
  if constexpr (pairs)
    for (int u = 0; u < U; ++u)
      for (int i = 0; i < D / 2; ++i) {
        uint32_t w = 0;
        if (u < nq * G) std::memcpy(&w, q + (j0 + u / G) * qs0 + (h * G + u % G) * qs1 + 2 * i, 4);
        qp[u][i] = w;
      }
  // V as pairs of keys: the bfloat16 of keys 2j and 2j + 1 interleaved (unpacklo / unpackhi of
  // their rows, which orders the dimensions as the output's loop undoes), met by the weights'
  // pairs (the weights rounded to bfloat16 for the products, their sum kept in float32)
  alignas(64) uint32_t vi[pairs ? kKeys / 2 : 1][pairs ? D : 1];
  alignas(64) uint32_t pw[pairs ? U : 1][kKeys / 2];
#else
  constexpr bool pairs = false;
#endif
  alignas(64) float vf[kKeys][D];
  const int64_t nu = nq * G;
  for (int u = 0; u < U; ++u) {
    const int64_t r = u / G, g = u % G;
    pos[u] = u < nu ? prefix + j0 + r : -1;
    m[u] = ninf, l[u] = 0.f;
    std::fill(acc[u], acc[u] + D, 0.f);
    if (pairs) continue;  // the queries are read as pairs (qp) instead
    if (u >= nu) {
      std::fill(qf[u], qf[u] + D, 0.f);
      continue;
    }
    const A* qr = q + (j0 + r) * qs0 + (h * G + g) * qs1;
    // the query in the pool's dtype, then scaled (as the decode kernel reads it)
    for (int i = 0; i < D; ++i) qf[u][i] = f32(static_cast<P>(f32(qr[i]))) * scale;
  }
  const int64_t last = prefix + j0 + nq;  // keys [0, last) are seen by some query here
  for (int64_t k0 = 0; k0 < last; k0 += kKeys) {
    const int64_t nk = std::min<int64_t>(kKeys, last - k0);
    for (int64_t s = 0; s < kKeys; ++s) {
      if (s >= nk) {
#if defined(__AVX512BF16__)
        if constexpr (pairs) {
          for (int i = 0; i < D / 2; ++i) kt2[i][s] = 0;
          continue;
        }
#endif
        for (int i = 0; i < D; ++i) kt[i][s] = 0.f, vf[s][i] = 0.f;
        continue;
      }
      const int64_t at = (srow[(k0 + s) * ss1] * kvh + h) * D;
#if defined(__AVX512BF16__)
      if constexpr (pairs) {
        const uint32_t* k2 = reinterpret_cast<const uint32_t*>(pk + at);
        for (int i = 0; i < D / 2; ++i) kt2[i][s] = k2[i];
      } else
#endif
        for (int i = 0; i < D; ++i) kt[i][s] = f32(pk[at + i]);
      if (!pairs)
        for (int c = 0; c < C; ++c) _mm512_store_ps(vf[s] + 16 * c, load16(pv + at + 16 * c));
    }
#if defined(__AVX512BF16__)
    if constexpr (pairs)
      for (int64_t j = 0; j < kKeys / 2; ++j) {
        const int64_t s0 = 2 * j, s1 = 2 * j + 1;
        const P* r0 = s0 < nk ? pv + (srow[(k0 + s0) * ss1] * kvh + h) * D : nullptr;
        const P* r1 = s1 < nk ? pv + (srow[(k0 + s1) * ss1] * kvh + h) * D : nullptr;
        for (int c = 0; c < D / 32; ++c) {
          const __m512i a = r0 ? _mm512_loadu_si512(r0 + 32 * c) : _mm512_setzero_si512();
          const __m512i b = r1 ? _mm512_loadu_si512(r1 + 32 * c) : _mm512_setzero_si512();
          _mm512_store_si512(vi[j] + 32 * c, _mm512_unpacklo_epi16(a, b));
          _mm512_store_si512(vi[j] + 32 * c + 16, _mm512_unpackhi_epi16(a, b));
        }
      }
#endif
    // queries at positions before k0 do not see this block: the tiles start at the first that does
    const int u0_first =
        static_cast<int>(std::max<int64_t>(0, k0 - prefix - j0) * G) / kTile * kTile;
    for (int u0 = u0_first; u0 < nu; u0 += kTile) {
      __m512 t[kTile];
      for (int k = 0; k < kTile; ++k) t[k] = _mm512_setzero_ps();
#if defined(__AVX512BF16__)
      if constexpr (pairs) {
        for (int i = 0; i < D / 2; ++i) {
          const __m512bh kv = (__m512bh)_mm512_load_si512(kt2[i]);
          for (int k = 0; k < kTile; ++k)
            t[k] = _mm512_dpbf16_ps(
                t[k], (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[u0 + k][i])), kv);
        }
        for (int k = 0; k < kTile; ++k)
          _mm512_store_ps(sc[u0 + k], _mm512_mul_ps(t[k], _mm512_set1_ps(scale)));
        continue;
      }
#endif
      for (int i = 0; i < D; ++i) {
        const __m512 kv = _mm512_load_ps(kt[i]);
        for (int k = 0; k < kTile; ++k)
          t[k] = _mm512_fmadd_ps(_mm512_set1_ps(qf[u0 + k][i]), kv, t[k]);
      }
      for (int k = 0; k < kTile; ++k) _mm512_store_ps(sc[u0 + k], t[k]);
    }
    for (int u = 0; u < nu; ++u) {
      if (k0 > pos[u]) {  // the block is past this query: nothing changes
        std::fill(sc[u], sc[u] + kKeys, 0.f);
#if defined(__AVX512BF16__)
        if constexpr (pairs) std::fill(pw[u], pw[u] + kKeys / 2, 0u);
#endif
        alpha[u] = 1.f;
        continue;
      }
      const int64_t seen = std::min<int64_t>(kKeys, pos[u] - k0 + 1);
      const __mmask16 live = static_cast<__mmask16>(seen == 16 ? 0xFFFF : (1u << seen) - 1);
      const __m512 s = _mm512_mask_blend_ps(live, _mm512_set1_ps(ninf), _mm512_load_ps(sc[u]));
      const float mu = std::max(m[u], _mm512_reduce_max_ps(s));
      const __m512 p = Sleef_expf16_u10(_mm512_sub_ps(s, _mm512_set1_ps(mu)));
      alpha[u] = std::exp(m[u] - mu);  // 0 on the query's first block (m is -inf)
      l[u] = l[u] * alpha[u] + _mm512_reduce_add_ps(p);
      m[u] = mu;
      _mm512_store_ps(sc[u], p);
#if defined(__AVX512BF16__)
      if constexpr (pairs)  // the weights in bfloat16, for the products with V
        _mm256_store_si256(reinterpret_cast<__m256i*>(pw[u]), (__m256i)_mm512_cvtneps_pbh(p));
#endif
    }
    for (int u = nu; u < U; ++u) {
      alpha[u] = 1.f;
      std::fill(sc[u], sc[u] + kKeys, 0.f);
#if defined(__AVX512BF16__)
      if constexpr (pairs) std::fill(pw[u], pw[u] + kKeys / 2, 0u);
#endif
    }
    const int v_first = u0_first / UQ * UQ;
    for (int u0 = v_first; u0 < nu; u0 += UQ) {
      __m512 a[UQ][C];
      for (int k = 0; k < UQ; ++k) {
        const __m512 al = _mm512_set1_ps(alpha[u0 + k]);
        for (int c = 0; c < C; ++c)
          a[k][c] = _mm512_mul_ps(_mm512_load_ps(acc[u0 + k] + 16 * c), al);
      }
#if defined(__AVX512BF16__)
      if constexpr (pairs) {
        for (int j = 0; j < (nk + 1) / 2; ++j) {
          __m512bh v[C];
          for (int c = 0; c < C; ++c) v[c] = (__m512bh)_mm512_load_si512(vi[j] + 16 * c);
          for (int k = 0; k < UQ; ++k) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(pw[u0 + k][j]));
            for (int c = 0; c < C; ++c) a[k][c] = _mm512_dpbf16_ps(a[k][c], w, v[c]);
          }
        }
        for (int k = 0; k < UQ; ++k)
          for (int c = 0; c < C; ++c) _mm512_store_ps(acc[u0 + k] + 16 * c, a[k][c]);
        continue;
      }
#endif
      for (int s = 0; s < nk; ++s) {
        __m512 v[C];
        for (int c = 0; c < C; ++c) v[c] = _mm512_load_ps(vf[s] + 16 * c);
        for (int k = 0; k < UQ; ++k) {
          const __m512 w = _mm512_set1_ps(sc[u0 + k][s]);
          for (int c = 0; c < C; ++c) a[k][c] = _mm512_fmadd_ps(w, v[c], a[k][c]);
        }
      }
      for (int k = 0; k < UQ; ++k)
        for (int c = 0; c < C; ++c) _mm512_store_ps(acc[u0 + k] + 16 * c, a[k][c]);
    }
  }
  for (int u = 0; u < nu; ++u) {
    const int64_t r = u / G, g = u % G;
    A* o = out + (j0 + r) * os0 + (h * G + g) * os1;
    const float inv = 1.f / l[u];
    if (pairs) {  // unpacklo / unpackhi's order: chunk c, lane ln holds this dimension
      for (int c = 0; c < C; ++c)
        for (int ln = 0; ln < 16; ++ln)
          o[32 * (c / 2) + 8 * (ln / 4) + 4 * (c % 2) + ln % 4] =
              static_cast<A>(acc[u][16 * c + ln] * inv);
      continue;
    }
    for (int i = 0; i < D; ++i) o[i] = static_cast<A>(acc[u][i] * inv);
  }
}

#if defined(ATTEST_EXTEND_LAID)
// ---- the laid-out method ----------------------------------------------------------------------
//
// A request's context, for each KV head, is first laid out once in a scratch buffer: its keys as
// rows (16 keys' 32 dimensions are an A tile) and its values transposed (16 dimensions' 32 keys
// are one), each padded with zeros to whole blocks of 32 keys. A work item is then 16
// consecutive queries of one query head. Per block of 32 keys it takes the scores transposed,
// S^T = K Q^T (the item's queries laid out once as pairs of dimensions, a vector of 16 queries a
// pair), so each key's 16 scores are one vector of the 16 queries: the running max, the weights
// and their sum are lane-wise, with no sum across lanes. The weights rounded to bfloat16, as
// pairs of keys a vector, meet V^T in O^T += V^T P^T (O^T: a vector of the 16 queries a
// dimension).
//
// The products run on AMX's tiles where the CPU has them (tile_item: 16 keys x 16 queries of
// S^T, or 16 dimensions x 16 queries of O^T, a tile product) and as AVX-512 BF16 pair products
// elsewhere (pair_item: a key's pair of dimensions, or a dimension's pair of keys, broadcast
// against the vector of 16 queries' pairs); the softmax between them is the same code.
//
// The running max is raised lazily: a query's reference moves only when a block's max passes it
// by more than 2^8 in the weights (then the query's sum and output are rescaled), so the
// weights against it stay at most 256 and most blocks rescale nothing. The softmax is the same
// function of the scores; only the reference its terms are taken against differs.
namespace laid {

constexpr int kQ = 16;      // queries an item: a tile's 16 columns
constexpr int kBlock = 32;  // keys a block: the K dimension of one bfloat16 tile product
constexpr float kLazy = 8.f;  // log2 of the most a weight may reach before the reference moves

// 2^x a lane, x at most about 16: x = n + f with |f| <= 1/2, 2^f by its Taylor polynomial to
// the sixth power (relative error under 2e-7, far inside the bfloat16 the weights are rounded
// to), times 2^n by vscalefps. Below -127 (a -inf or NaN among them) it is 2^-127.
inline __m512 exp2_16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-127.f));  // a NaN in x gives the second operand
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// The lanes n >= t of 16 (t <= 0: all; t >= 16: none): the queries that see a key t positions
// past the item's first query.
inline __mmask16 from_lane(int64_t t) {
  if (t <= 0) return 0xFFFF;
  if (t >= 16) return 0;
  return static_cast<__mmask16>(0xFFFFu << t);
}

// The 16 x 16 matrix of 32-bit elements in rows[0..15] transposed in place.
inline void transpose16(__m512i* rows) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // pairs of rows: their elements interleaved
    t[i] = _mm512_unpacklo_epi32(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(rows[i], rows[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // then pairs of pairs
    rows[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    rows[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    rows[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    rows[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // each 128-bit lane now holds a 4 x 4 block: gather the lanes across four rows apart
  for (int i = 0; i < 4; ++i) {
    const __m512i a = _mm512_shuffle_i32x4(rows[i], rows[i + 4], 0x88);   // lanes 0, 2 of each
    const __m512i b = _mm512_shuffle_i32x4(rows[i], rows[i + 4], 0xdd);   // lanes 1, 3
    const __m512i c = _mm512_shuffle_i32x4(rows[i + 8], rows[i + 12], 0x88);
    const __m512i d = _mm512_shuffle_i32x4(rows[i + 8], rows[i + 12], 0xdd);
    t[i] = _mm512_shuffle_i32x4(a, c, 0x88);
    t[i + 8] = _mm512_shuffle_i32x4(a, c, 0xdd);
    t[i + 4] = _mm512_shuffle_i32x4(b, d, 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(b, d, 0xdd);
  }
  for (int i = 0; i < 16; ++i) rows[i] = t[i];
}

// A request's context for one KV head: keys as rows ([Lp, D]), values transposed ([D, Lp]).
struct Laid {
  uint16_t* k;
  uint16_t* vt;
  int64_t Lp;
};

// Lay out keys [0, L) of (slots, head h) from the pool into k and vt (Lp = L rounded up to
// kBlock; the rest zeros), a block of kBlock keys at a time: their rows read once into L1, each
// dimension's row of vt written whole.
template <int D>
void lay_out(const uint16_t* pk, const uint16_t* pv, int64_t kvh, int64_t h, const int64_t* srow,
             int64_t ss1, int64_t L, int64_t Lp, uint16_t* k, uint16_t* vt) {
  alignas(64) uint16_t vb[kBlock][D];
  for (int64_t k0 = 0; k0 < Lp; k0 += kBlock) {
    for (int j = 0; j < kBlock; ++j) {
      if (k0 + j >= L) {
        std::memset(k + (k0 + j) * D, 0, D * sizeof(uint16_t));
        std::memset(vb[j], 0, D * sizeof(uint16_t));
        continue;
      }
      const int64_t at = (srow[(k0 + j) * ss1] * kvh + h) * D;
      std::memcpy(k + (k0 + j) * D, pk + at, D * sizeof(uint16_t));
      std::memcpy(vb[j], pv + at, D * sizeof(uint16_t));
    }
    for (int d = 0; d < D; ++d)
      for (int j = 0; j < kBlock; ++j) vt[d * Lp + k0 + j] = vb[j][d];
  }
}

// The item's queries (rows q + n * qs0, n < nq; the rest zeros) as pairs of dimensions: qt[c][p]
// holds, for each query n in its lane, dimensions 32c + 2p and 32c + 2p + 1 (a B tile a chunk).
template <int C>
void query_pairs(const uint16_t* q, int64_t qs0, int64_t nq, uint32_t (*qt)[16][kQ]) {
  for (int c = 0; c < C; ++c) {
    __m512i rows[kQ];
    for (int n = 0; n < kQ; ++n)
      rows[n] = n < nq ? _mm512_loadu_si512(q + n * qs0 + 32 * c) : _mm512_setzero_si512();
    transpose16(rows);
    for (int p = 0; p < 16; ++p) _mm512_store_si512(qt[c][p], rows[p]);
  }
}

// The rows of O^T times alpha, lane-wise.
template <int D>
inline void rescale(float (*ot)[kQ], __m512 alpha) {
  for (int d = 0; d < D; ++d) _mm512_store_ps(ot[d], _mm512_mul_ps(_mm512_load_ps(ot[d]), alpha));
}

// The softmax of an item's 16 queries, a block of scores at a time, lane-wise.
class Softmax {
 public:
  explicit Softmax(float scale)
      : cs_(_mm512_set1_ps(scale * 1.4426950408889634f)),  // scores to log2 units
        ms_(_mm512_set1_ps(-std::numeric_limits<float>::infinity())) {}

  // The scores s of the block at k0 (s[i]: key k0 + i's 16 queries; queries from position
  // qpos0, keys [0, last) seen by some of them) into the weights' pairs of keys pt (pt[j]: keys
  // 2j and 2j + 1 of the block, a pair a lane), the sums kept; where a query's reference moves,
  // rescale(alpha) first scales what was summed for it (alpha 1 in the other lanes).
  template <typename Rescale>
  void weigh(const float (*s)[kQ], int64_t k0, int64_t qpos0, int64_t last,
             uint16_t (*pt)[2 * kQ], Rescale&& rescale) {
    const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    // key k0 + i is seen by the lanes n with qpos0 + n >= k0 + i: every lane for every key of a
    // block that ends before the first query; a mask a key on the diagonal's blocks
    const bool whole = k0 + kBlock - 1 <= qpos0;
    const int rows = static_cast<int>(std::min<int64_t>(kBlock, last - k0));
    __m512 b[4] = {ninf, ninf, ninf, ninf};
    if (whole)
      for (int i = 0; i < kBlock; ++i) b[i % 4] = _mm512_max_ps(b[i % 4], _mm512_load_ps(s[i]));
    else
      for (int i = 0; i < rows; ++i)
        b[i % 4] = _mm512_mask_max_ps(b[i % 4], from_lane(k0 + i - qpos0), b[i % 4],
                                      _mm512_load_ps(s[i]));
    const __m512 bms =
        _mm512_mul_ps(_mm512_max_ps(_mm512_max_ps(b[0], b[1]), _mm512_max_ps(b[2], b[3])), cs_);
    const __mmask16 moved =
        _mm512_cmp_ps_mask(bms, _mm512_add_ps(ms_, _mm512_set1_ps(kLazy)), _CMP_GT_OQ);
    if (k0 == 0) {  // the first block: nothing summed yet to rescale
      ms_ = bms;
    } else if (moved) {  // rescale the sums and O^T of the queries whose reference moves
      const __m512 alpha =
          _mm512_mask_blend_ps(moved, _mm512_set1_ps(1.f), exp2_16(_mm512_sub_ps(ms_, bms)));
      l0_ = _mm512_mul_ps(l0_, alpha);
      l1_ = _mm512_mul_ps(l1_, alpha);
      rescale(alpha);
      ms_ = _mm512_mask_mov_ps(ms_, moved, bms);
    }
    // pair n of the weights' keys 2p and 2p + 1: bf16 lanes n and 16 + n of cvtne2ps's result
    alignas(64) static constexpr uint16_t kPairs[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                        21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                                        11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i pairs = _mm512_load_si512(kPairs);
    for (int i = 0; i < kBlock; i += 2) {
      __m512 p0 = exp2_16(_mm512_fmsub_ps(_mm512_load_ps(s[i]), cs_, ms_));
      __m512 p1 = exp2_16(_mm512_fmsub_ps(_mm512_load_ps(s[i + 1]), cs_, ms_));
      if (!whole) {
        p0 = _mm512_maskz_mov_ps(i < rows ? from_lane(k0 + i - qpos0) : 0, p0);
        p1 = _mm512_maskz_mov_ps(i + 1 < rows ? from_lane(k0 + i + 1 - qpos0) : 0, p1);
      }
      l0_ = _mm512_add_ps(l0_, p0);
      l1_ = _mm512_add_ps(l1_, p1);
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);  // p0's 16, then p1's
      _mm512_store_si512(pt[i / 2], _mm512_permutexvar_epi16(pairs, both));
    }
  }

  // Each query's column of O^T divided by its sum and rounded to bfloat16 (to nearest even, as
  // a cast rounds) into out (rows out + n * os0, n < nq): 16 dimensions at a time, their 16 x 16
  // block transposed.
  template <int D>
  void finish(const float (*ot)[kQ], int64_t nq, c10::BFloat16* out, int64_t os0) const {
    alignas(64) float inv[kQ];
    _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(l0_, l1_)));
    for (int dt = 0; dt < D / 16; ++dt) {
      __m512i rows[16];
      for (int i = 0; i < 16; ++i) rows[i] = _mm512_load_si512(ot[16 * dt + i]);
      transpose16(rows);
      for (int64_t n = 0; n < nq; ++n) {
        const __m512 o = _mm512_mul_ps(_mm512_castsi512_ps(rows[n]), _mm512_set1_ps(inv[n]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + n * os0 + 16 * dt),
                            (__m256i)_mm512_cvtneps_pbh(o));
      }
    }
  }

 private:
  __m512 cs_;
  __m512 ms_;  // each query's reference, log2 units
  __m512 l0_ = _mm512_setzero_ps(), l1_ = _mm512_setzero_ps();  // the sums, even and odd keys
};

// The 32-bit pair at p (two bfloat16), for a broadcast.
inline int pair_at(const uint16_t* p) {
  int v;
  std::memcpy(&v, p, 4);
  return v;
}

// One item on vectors: queries j0 .. j0 + nq - 1 of a request (rows q + j * qs0 of one query
// head, the first at position qpos0), against keys [0, qpos0 + nq) of its laid-out context; the
// output rows out + j * os0. A block's scores 16 keys at a time (16 accumulators, each query
// pair vector met by every key's pair broadcast), O^T 16 dimensions at a time (each pair of
// keys' weights met by every dimension's pair of values broadcast).
template <int D>
void pair_item(const uint16_t* q, int64_t qs0, const Laid& ctx, int64_t qpos0, int64_t nq,
               float scale, c10::BFloat16* out, int64_t os0) {
  constexpr int C = D / 32;
  alignas(64) uint32_t qt[C][16][kQ];
  alignas(64) float sb[kBlock][kQ];
  alignas(64) uint16_t pt[kBlock / 2][2 * kQ];
  alignas(64) float ot[D][kQ];
  query_pairs<C>(q, qs0, nq, qt);
  std::memset(ot, 0, sizeof(ot));
  Softmax sm(scale);
  const int64_t last = qpos0 + nq;
  for (int64_t k0 = 0; k0 < last; k0 += kBlock) {
    const int rows = static_cast<int>(std::min<int64_t>(kBlock, last - k0));
    for (int i0 = 0; i0 < kBlock; i0 += 16) {
      __m512 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
      if (i0 < rows) {  // past them the scores are masked out: zeros stand in
        const uint16_t* kr = ctx.k + (k0 + i0) * D;
        for (int c = 0; c < C; ++c)
          for (int p = 0; p < 16; ++p) {
            const __m512bh qv = (__m512bh)_mm512_load_si512(qt[c][p]);
            for (int i = 0; i < 16; ++i)
              acc[i] = _mm512_dpbf16_ps(
                  acc[i], (__m512bh)_mm512_set1_epi32(pair_at(kr + i * D + 32 * c + 2 * p)), qv);
          }
      }
      for (int i = 0; i < 16; ++i) _mm512_store_ps(sb[i0 + i], acc[i]);
    }
    sm.weigh(sb, k0, qpos0, last, pt, [&](__m512 alpha) { rescale<D>(ot, alpha); });
    const uint16_t* vt = ctx.vt + k0;
    const int pairs = (rows + 1) / 2;  // the weights' pairs past them are zeros
    for (int d0 = 0; d0 < D; d0 += 16) {
      __m512 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_load_ps(ot[d0 + i]);
      for (int j = 0; j < pairs; ++j) {
        const __m512bh w = (__m512bh)_mm512_load_si512(pt[j]);
        for (int i = 0; i < 16; ++i)
          acc[i] = _mm512_dpbf16_ps(
              acc[i], (__m512bh)_mm512_set1_epi32(pair_at(vt + (d0 + i) * ctx.Lp + 2 * j)), w);
      }
      for (int i = 0; i < 16; ++i) _mm512_store_ps(ot[d0 + i], acc[i]);
    }
  }
  sm.finish<D>(ot, nq, out, os0);
}

#if defined(ATTEST_EXTEND_TILES)
// O^T's four tiles for a head size of 64, held in tiles 2 to 5 across the blocks (a macro: the
// tile intrinsics take their tiles' numbers as literals).
#define ATTEST_OT_TILES(op, ot) \
  do {                          \
    op(2, ot[0], 64);           \
    op(3, ot[16], 64);          \
    op(4, ot[32], 64);          \
    op(5, ot[48], 64);          \
  } while (0)

// One item on the tiles (pair_item's arguments). Tiles: 0, 1 a block's scores; 6 an A tile
// (keys, or V^T), 7 a B tile (the queries' pairs, or the weights'); O^T in tiles 2 to 5 at a
// head size of 64, else in L1 and a tile at a time through tile 2.
template <int D>
void tile_item(const uint16_t* q, int64_t qs0, const Laid& ctx, int64_t qpos0, int64_t nq,
               float scale, c10::BFloat16* out, int64_t os0) {
  constexpr int C = D / 32;  // the dimensions' chunks of a tile product
  constexpr bool held = D == 64;
  alignas(64) uint32_t qt[C][16][kQ];   // B tiles: the queries' pairs of dimensions
  alignas(64) float sb[2][kBlock][kQ];  // a block's scores, and the next block's
  alignas(64) uint16_t pt[16][2 * kQ];  // B tile: the weights' pairs of keys
  alignas(64) float ot[D][kQ];          // O^T
  query_pairs<C>(q, qs0, nq, qt);
  if constexpr (held) {
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
  } else {
    std::memset(ot, 0, sizeof(ot));
  }
  Softmax sm(scale);
  const int64_t last = qpos0 + nq;  // keys [0, last) are seen by some query here
  // the scores of the block at k0 into sb[at]: issued a block ahead, so the tiles compute the
  // next block's while the vector units take this one's softmax
  auto scores = [&](int64_t k0, int at) {
    _tile_zero(0);
    _tile_zero(1);
    for (int c = 0; c < C; ++c) {
      _tile_loadd(7, qt[c], 64);
      _tile_loadd(6, ctx.k + k0 * D + 32 * c, D * 2);
      _tile_dpbf16ps(0, 6, 7);
      _tile_loadd(6, ctx.k + (k0 + 16) * D + 32 * c, D * 2);
      _tile_dpbf16ps(1, 6, 7);
    }
    _tile_stored(0, sb[at][0], 64);
    _tile_stored(1, sb[at][16], 64);
  };
  scores(0, 0);
  for (int64_t k0 = 0, at = 0; k0 < last; k0 += kBlock, at ^= 1) {
    if (k0 + kBlock < last) scores(k0 + kBlock, at ^ 1);
    sm.weigh(sb[at], k0, qpos0, last, pt, [&](__m512 alpha) {
      if constexpr (held) ATTEST_OT_TILES(_tile_stored, ot);
      rescale<D>(ot, alpha);
      if constexpr (held) ATTEST_OT_TILES(_tile_loadd, ot);
    });
    _tile_loadd(7, pt, 64);
    const uint16_t* vt = ctx.vt + k0;
    const int64_t vs = ctx.Lp * 2;
    if constexpr (held) {
      _tile_loadd(6, vt, vs);
      _tile_dpbf16ps(2, 6, 7);
      _tile_loadd(6, vt + 16 * ctx.Lp, vs);
      _tile_dpbf16ps(3, 6, 7);
      _tile_loadd(6, vt + 32 * ctx.Lp, vs);
      _tile_dpbf16ps(4, 6, 7);
      _tile_loadd(6, vt + 48 * ctx.Lp, vs);
      _tile_dpbf16ps(5, 6, 7);
    } else {
      for (int dt = 0; dt < D / 16; ++dt) {
        _tile_loadd(2, ot[16 * dt], 64);
        _tile_loadd(6, vt + 16 * dt * ctx.Lp, vs);
        _tile_dpbf16ps(2, 6, 7);
        _tile_stored(2, ot[16 * dt], 64);
      }
    }
  }
  if constexpr (held) ATTEST_OT_TILES(_tile_stored, ot);
  sm.finish<D>(ot, nq, out, os0);
}
#undef ATTEST_OT_TILES
#endif

}  // namespace laid
#endif



template <typename A, typename P>
using ItemFn = void (*)(const A*, int64_t, int64_t, const P*, const P*, int64_t, int64_t,
                        const int64_t*, int64_t, int64_t, int64_t, int64_t, float, A*, int64_t,
                        int64_t);

template <typename A, typename P>
ItemFn<A, P> item_fn(int64_t d, int64_t group) {
  return by_shape<ItemFn<A, P>>(d, group, [](auto D, auto G) -> ItemFn<A, P> {
    return extend_item<A, P, decltype(D)::value, decltype(G)::value>;
  });
}

// Requests of at least this many new tokens take the laid-out method where it runs (fewer would
// pay for laying out the whole context for less than one item's queries).
constexpr int64_t kLaidRows = 16;

template <typename A, typename P>
void extend_kernel(const at::Tensor& q, const at::Tensor& pool_k, const at::Tensor& pool_v,
                   const at::Tensor& slots, const at::Tensor& prefix, const at::Tensor& starts,
                   const at::Tensor& ext, double scale, at::Tensor& out) {
  const int64_t H = q.size(1), d = q.size(2), kvh = pool_k.size(1), group = H / kvh;
  const ItemFn<A, P> fn = item_fn<A, P>(d, group);
  TORCH_CHECK(fn != nullptr, "extend_attention: head size ", d, " with ", group,
              " query heads a KV head (64 or 128, 1 to 8)");
  const int64_t R = slots.size(0), W = slots.size(1);
  const int64_t* pre = prefix.data_ptr<int64_t>();
  const int64_t* st = starts.data_ptr<int64_t>();
  const int64_t* ex = ext.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r)
    TORCH_CHECK(pre[r] >= 0 && ex[r] >= 1 && pre[r] + ex[r] <= W && st[r] >= 0 &&
                    st[r] + ex[r] <= q.size(0),
                "extend_attention: request ", r, " reads past its slots or rows");
  const A* qp = q.data_ptr<A>();
  const P* pk = pool_k.data_ptr<P>();
  const P* pv = pool_v.data_ptr<P>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  A* op = out.data_ptr<A>();
  // the requests the laid-out method takes: their contexts laid out (per KV head, at lay[r] +
  // h * size[r])
  std::vector<char> on_laid(R, 0);
#if defined(ATTEST_EXTEND_LAID)
  constexpr bool bf16 = std::is_same_v<A, c10::BFloat16> && std::is_same_v<P, c10::BFloat16>;
  const int way = way_now();
  if (bf16 && way != kLoops)
    for (int64_t r = 0; r < R; ++r) on_laid[r] = ex[r] >= kLaidRows;
  std::vector<int64_t> lay(R + 1, 0);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t Lp = (pre[r] + ex[r] + laid::kBlock - 1) / laid::kBlock * laid::kBlock;
    lay[r + 1] = lay[r] + (on_laid[r] ? 2 * Lp * d * kvh : 0);
  }
  std::vector<uint16_t> laid_out(lay[R]);
  auto laid_of = [&](int64_t r, int64_t h) {
    const int64_t Lp = (lay[r + 1] - lay[r]) / (2 * d * kvh);
    uint16_t* k = laid_out.data() + lay[r] + h * 2 * Lp * d;
    return laid::Laid{k, k + Lp * d, Lp};
  };
  if (lay[R] > 0) {
    std::vector<std::array<int64_t, 2>> lays;
    for (int64_t r = 0; r < R; ++r)
      if (on_laid[r])
        for (int64_t h = 0; h < kvh; ++h) lays.push_back({r, h});
    at::parallel_for(0, static_cast<int64_t>(lays.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const auto [r, h] = lays[i];
        const laid::Laid at = laid_of(r, h);
        const auto* pk16 = reinterpret_cast<const uint16_t*>(pk);
        const auto* pv16 = reinterpret_cast<const uint16_t*>(pv);
        const int64_t L = pre[r] + ex[r];
        if (d == 64)
          laid::lay_out<64>(pk16, pv16, kvh, h, sl + r * slots.stride(0), slots.stride(1), L,
                            at.Lp, at.k, at.vt);
        else
          laid::lay_out<128>(pk16, pv16, kvh, h, sl + r * slots.stride(0), slots.stride(1), L,
                             at.Lp, at.k, at.vt);
      }
    });
  }
  using LaidFn = void (*)(const uint16_t*, int64_t, const laid::Laid&, int64_t, int64_t, float,
                          c10::BFloat16*, int64_t);
  LaidFn laid_item = d == 64 ? &laid::pair_item<64> : &laid::pair_item<128>;
#if defined(ATTEST_EXTEND_TILES)
  if (way == kTiles) laid_item = d == 64 ? &laid::tile_item<64> : &laid::tile_item<128>;
#endif
#endif
  // the items: (request, KV head or query head laid out, kQueries positions), the longest
  // contexts first
  std::vector<std::array<int64_t, 3>> items;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < (on_laid[r] ? H : kvh); ++h)
      for (int64_t j0 = 0; j0 < ex[r]; j0 += kQueries) items.push_back({r, h, j0});
  std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
    return pre[a[0]] + a[2] > pre[b[0]] + b[2];
  });
  // the threads take the items one at a time, the longest first: an item's work grows with its
  // position, and a static split of the sorted items gave the first thread three quarters of a
  // fresh prompt's
  const int64_t n = static_cast<int64_t>(items.size());
  std::atomic<int64_t> taken{0};
  at::parallel_for(0, std::min<int64_t>(n, at::get_num_threads()), 1, [&](int64_t, int64_t) {
#if defined(ATTEST_EXTEND_TILES)
    bool configured = false;
#endif
    for (int64_t i; (i = taken.fetch_add(1, std::memory_order_relaxed)) < n;) {
      const auto [r, h, j0] = items[i];
      const int64_t nq = std::min<int64_t>(kQueries, ex[r] - j0);
#if defined(ATTEST_EXTEND_LAID)
      if (on_laid[r]) {
#if defined(ATTEST_EXTEND_TILES)
        if (way == kTiles && !configured) {
          const WholeTiles cfg;
          _tile_loadconfig(&cfg);
          configured = true;
        }
#endif
        const auto* q16 = reinterpret_cast<const uint16_t*>(qp);
        const int64_t row = st[r] + j0;
        auto* o = reinterpret_cast<c10::BFloat16*>(op) + row * out.stride(0) + h * out.stride(1);
        laid_item(q16 + row * q.stride(0) + h * q.stride(1), q.stride(0), laid_of(r, h / group),
                  pre[r] + j0, nq, static_cast<float>(scale), o, out.stride(0));
        continue;
      }
#endif
      fn(qp + st[r] * q.stride(0), q.stride(0), q.stride(1), pk, pv, kvh, h,
         sl + r * slots.stride(0), slots.stride(1), pre[r], j0, nq, static_cast<float>(scale),
         op + st[r] * out.stride(0), out.stride(0), out.stride(1));
    }
#if defined(ATTEST_EXTEND_TILES)
    if (configured) _tile_release();
#endif
  });
}

}  // namespace
#endif

// How a bfloat16 chunk of at least 16 new tokens over a bfloat16 pool runs here: "tiles" (the
// laid-out method on AMX's tiles), "pairs" (the same on AVX-512 BF16 vectors) or "loops" (the
// items' vector loops, as every other chunk).
std::string extend_way() { return kWayNames[way_now()]; }

// Sets the way (to measure one against another; one this CPU cannot run is refused); returns
// the way that ran before.
std::string set_extend_way(const std::string& name) {
  const int w = way_of(name);
  TORCH_CHECK(w >= 0 && w <= best_way(), "set_extend_way: '", name, "' cannot run here (this CPU ",
              "runs ", kWayNames[best_way()], " at most; the ways: loops, pairs, tiles)");
  const std::string was = extend_way();
  way_chosen().store(w);
  return was;
}

bool extend_attention_built() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

// q: [T, heads, d] (rows may be strided, the last dimension dense); pool_k/pool_v: [slots,
// kv_heads, d], this forward's K/V already stored; slots: [R, width] each request's context
// slots; prefix, starts, ext: [R] its tokens already in the pool, its first row of q, its new
// tokens. Row starts[r] + j attends to slots[r, 0 ..= prefix[r] + j]. Returns [T, heads, d].
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& pool_k,
                            const at::Tensor& pool_v, const at::Tensor& slots,
                            const at::Tensor& prefix, const at::Tensor& starts,
                            const at::Tensor& ext, double scale) {
  TORCH_CHECK(extend_attention_built(), "extend_attention: built for a CPU without AVX-512");
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 3 && q.stride(2) == 1,
              "q must be [T, heads, d] on the cpu, dense in its last dimension");
  TORCH_CHECK(pool_k.is_contiguous() && pool_v.is_contiguous() &&
                  pool_k.sizes() == pool_v.sizes() && pool_k.dtype() == pool_v.dtype(),
              "the pool's K and V must be contiguous and alike");
  TORCH_CHECK(q.size(1) % pool_k.size(1) == 0 && q.size(2) == pool_k.size(2), "shape mismatch");
  for (const auto* t : {&slots, &prefix, &starts, &ext})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->stride(-1) == 1, "indices must be int64");
  TORCH_CHECK(prefix.is_contiguous() && starts.is_contiguous() && ext.is_contiguous() &&
                  prefix.size(0) == slots.size(0) && starts.size(0) == slots.size(0) &&
                  ext.size(0) == slots.size(0),
              "one prefix, start and length a request");
  at::Tensor out = at::zeros({q.size(0), q.size(1), q.size(2)}, q.options());
#if defined(__AVX512F__)
  by_dtypes(q.scalar_type(), pool_k.scalar_type(), "extend_attention", [&](auto a, auto p) {
    extend_kernel<decltype(a), decltype(p)>(q, pool_k, pool_v, slots, prefix, starts, ext, scale,
                                            out);
  });
#endif
  return out;
}

}  // namespace attest_ops
