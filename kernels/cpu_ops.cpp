// Native CPU ops for the decoder's hot path: the torch reference's decode attention and small
// per-layer operations, each one call instead of five to twenty. Built at install time by
// kernels/cpu_ops.py (torch's extension tooling); the engine runs the Python ops when the build
// is absent. Registered as torch.ops.attest.*.
//
// Arithmetic follows the Python ops step by step: float32 inside, every rounding to the
// activation dtype where the Python op rounds, and no fused multiply-adds (built with
// -ffp-contract=off), so the elementwise ops give the Python ops' bits. Reductions (the norm's
// sum of squares, attention's dot products and softmax sum) add in their own order; decode
// attention at head sizes 64 and 128 multiplies and adds in one rounding where it sums (head_v).
// The layers of a small decode forward, one call for all of them, are in cpu_step.cpp; the
// attention of a prefill chunk in cpu_extend.cpp.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_ops.h"

#if defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attest_ops {

using at::Tensor;

bool tiles_permitted() {
#if defined(__AMX_TILE__)
  static const bool ok = [] {
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

// What the activation dtype keeps of a float: a no-op for float, a rounding for bfloat16.
template <typename T>
inline float keep(float x) {
  return static_cast<float>(static_cast<T>(x));
}

template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * f32(b[i]);
  return s;
}

// One slot of decode attention for the ``rows`` query heads of an item (``group`` a KV head):
// their scores against the slot's K rows (written to scores[r * width]), or their accumulators
// plus p * V. Vector code for AVX-512 and head_dim a multiple of 16; the loops elsewhere.
template <typename P>
inline void slot_scores(const float* qf, const P* kr, int64_t rows, int64_t group, int64_t d,
                        float* scores, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) scores[r * width] = dot(qf + r * d, kr + (r / group) * d, d);
}

template <typename P>
inline void slot_accumulate(const float* p, int64_t width, const P* vr, int64_t rows,
                            int64_t group, int64_t d, float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    const float w = p[r * width];
    const P* vh = vr + (r / group) * d;
    float* a = acc + r * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) a[i] += w * f32(vh[i]);
  }
}

// softmax of sc[0, len) in place: exp(x - max) / sum, as torch's softmax
inline void softmax_row(float* sc, int64_t len) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < len; ++t) m = std::max(m, sc[t]);
  float sum = 0.f;
  for (int64_t t = 0; t < len; ++t) {
    sc[t] = std::exp(sc[t] - m);
    sum += sc[t];
  }
  for (int64_t t = 0; t < len; ++t) sc[t] /= sum;
}

#if defined(__AVX512F__)
inline void softmax_row_v(float* sc, int64_t len) {
  const int64_t tail = len % 16, body = len - tail;
  const __mmask16 mask = static_cast<__mmask16>((1u << tail) - 1);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 mv = ninf;
  for (int64_t t = 0; t < body; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sc + t));
  if (tail) mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(ninf, mask, sc + body));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 sv = _mm512_setzero_ps();
  for (int64_t t = 0; t < body; t += 16) {
    const __m512 e = Sleef_expf16_u10(_mm512_sub_ps(_mm512_loadu_ps(sc + t), m));
    _mm512_storeu_ps(sc + t, e);
    sv = _mm512_add_ps(sv, e);
  }
  if (tail) {  // lanes past len read -inf: exp gives 0, nothing is written
    const __m512 e = Sleef_expf16_u10(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, mask, sc + body), m));
    _mm512_mask_storeu_ps(sc + body, mask, e);
    sv = _mm512_add_ps(sv, e);
  }
  const __m512 sum = _mm512_set1_ps(_mm512_reduce_add_ps(sv));
  for (int64_t t = 0; t < body; t += 16)
    _mm512_storeu_ps(sc + t, _mm512_div_ps(_mm512_loadu_ps(sc + t), sum));
  if (tail)
    _mm512_mask_storeu_ps(sc + body, mask, _mm512_div_ps(_mm512_maskz_loadu_ps(mask, sc + body), sum));
}

template <typename P>
inline void slot_scores_v(const float* qf, const P* kr, int64_t rows, int64_t group, int64_t d,
                          float* scores, int64_t width) {
  for (int64_t h = 0; h < rows / group; ++h) {
    const P* k = kr + h * d;
    for (int64_t j = 0; j < group; ++j) {
      const float* q = qf + (h * group + j) * d;
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), load16(k));
      for (int64_t c = 16; c < d; c += 16)
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(q + c), load16(k + c)));
      scores[(h * group + j) * width] = _mm512_reduce_add_ps(acc);
    }
  }
}

template <typename P>
inline void slot_accumulate_v(const float* p, int64_t width, const P* vr, int64_t rows,
                              int64_t group, int64_t d, float* acc) {
  for (int64_t h = 0; h < rows / group; ++h) {
    for (int64_t c = 0; c < d; c += 16) {
      const __m512 v = load16(vr + h * d + c);
      for (int64_t j = 0; j < group; ++j) {
        const int64_t r = h * group + j;
        float* a = acc + r * d + c;
        const __m512 w = _mm512_set1_ps(p[r * width]);
        _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_mul_ps(w, v)));
      }
    }
  }
}

// r[s] = the sum of v[s]'s sixteen lanes, for sixteen vectors at once: three rounds of
// interleave-and-add instead of a horizontal reduction for each.
inline __m512 sums16(const __m512* v) {
  __m512 w[8], x[4];
  for (int k = 0; k < 8; ++k)
    w[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]),
                         _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  for (int m = 0; m < 4; ++m) {  // each 128-bit lane: its share of slots 4m .. 4m + 3
    const __m512d c = _mm512_castps_pd(w[2 * m]), e = _mm512_castps_pd(w[2 * m + 1]);
    x[m] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, e)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(c, e)));
  }
  const __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x88),
                                 _mm512_shuffle_f32x4(x[0], x[1], 0xDD));
  const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0x88),
                                 _mm512_shuffle_f32x4(x[2], x[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

// The largest count of 16-wide columns (a divisor of C) whose G rows of accumulators stay in
// registers: the V pass runs once per such band of columns.
constexpr int band_of(int G, int C) {
  int cc = C;
  while (cc > 1 && (G * cc > 24 || C % cc != 0)) --cc;
  return cc;
}

// A row of D pool values as C = D / 16 vectors of floats, in the pool's own order: float32
// rows as they are; bfloat16 rows 32 values at a time, the even ones then the odd ones (a
// shift and a mask of one load, no widening). Queries and outputs are permuted to match.
template <typename P, int D>
struct PoolRow;

template <int D>
struct PoolRow<float, D> {
  static inline void load(const float* p, __m512* v) {
    for (int c = 0; c < D / 16; ++c) v[c] = _mm512_loadu_ps(p + 16 * c);
  }
  static inline int at(int i) { return i; }  // where value i of a row lands
};

template <int D>
struct PoolRow<c10::BFloat16, D> {
  static inline void load(const c10::BFloat16* p, __m512* v) {
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (int c = 0; c < D / 32; ++c) {
      const __m512i x = _mm512_loadu_si512(p + 32 * c);
      v[2 * c] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
      v[2 * c + 1] = _mm512_castsi512_ps(_mm512_and_si512(x, high));
    }
  }
  static inline int at(int i) { return (i / 32) * 32 + (i % 2) * 16 + (i % 32) / 2; }
};

// The next work item's K and V rows, fetched into L2 a few lines at a time while this item
// computes: a burst of all of them at once would stall the loads this item waits on.
struct Ahead {
  std::vector<const char*> rows;  // each row ``bytes`` long
  int64_t bytes = 0, i = 0, off = 0;
  inline void step(int lines) {
    for (; lines > 0 && i < static_cast<int64_t>(rows.size()); --lines) {
      __builtin_prefetch(rows[i] + off, 0, 2);
      if ((off += 64) >= bytes) off = 0, ++i;
    }
  }
};

// Decode attention of one KV head of one request, its G query heads (qf: G x D, scaled, in
// float32) over its len slots, head size D: each slot's K row read once for all G queries, their
// products summed sixteen slots at a time (sums16); the softmax; then p * V with the accumulators
// in registers. sc: G rows of ``stride`` (len rounded up to 16) floats; out: G rows of D.
template <typename A, typename P, int D, int G>
void head_v(const float* qf, const P* pk, const P* pv, const int64_t* srow, int64_t ss1,
            int64_t kvh, int64_t h, int64_t len, float* sc, int64_t stride, A* out,
            Ahead& next) {
  using Row = PoolRow<P, D>;
  constexpr int C = D / 16, CC = band_of(G, C);
  constexpr int64_t ahead = 16, bytes = D * static_cast<int64_t>(sizeof(P));
  auto row = [&](int64_t t) { return (srow[t * ss1] * kvh + h) * D; };
  alignas(64) float qo[G * D];  // the queries in the pool's order
  for (int j = 0; j < G; ++j)
    for (int i = 0; i < D; ++i) qo[j * D + Row::at(i)] = qf[j * D + i];
  alignas(64) float part[G][16][16];  // each query's products with each of sixteen slots
  for (int64_t t0 = 0; t0 < len; t0 += 16) {
    const int64_t n = std::min<int64_t>(16, len - t0);
    for (int64_t s = 0; s < 16 && t0 + 16 + s < len; ++s) {  // the next block's K rows
      const char* nk = reinterpret_cast<const char*>(pk + row(t0 + 16 + s));
      for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(nk + off, 0, 3);
    }
    for (int64_t s = 0; s < 16; ++s) {
      if (s >= n) {
        for (int j = 0; j < G; ++j) _mm512_store_ps(part[j][s], _mm512_setzero_ps());
        continue;
      }
      next.step(4);
      __m512 k[C];
      Row::load(pk + row(t0 + s), k);
      for (int j = 0; j < G; ++j) {
        __m512 acc = _mm512_mul_ps(_mm512_load_ps(qo + j * D), k[0]);
        for (int c = 1; c < C; ++c)
          acc = _mm512_fmadd_ps(_mm512_load_ps(qo + j * D + 16 * c), k[c], acc);
        _mm512_store_ps(part[j][s], acc);
      }
    }
    for (int j = 0; j < G; ++j) {
      __m512 v[16];
      for (int s = 0; s < 16; ++s) v[s] = _mm512_load_ps(part[j][s]);
      _mm512_storeu_ps(sc + j * stride + t0, sums16(v));
    }
  }
  for (int j = 0; j < G; ++j) softmax_row_v(sc + j * stride, len);
  alignas(64) float o[G * D];  // the outputs in the pool's order
  for (int c0 = 0; c0 < C; c0 += CC) {
    __m512 acc[G][CC];
    for (int j = 0; j < G; ++j)
      for (int c = 0; c < CC; ++c) acc[j][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; ++t) {
      if (t + ahead < len) {
        const char* nv = reinterpret_cast<const char*>(pv + row(t + ahead));
        for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(nv + off, 0, 3);
      }
      next.step(4);
      __m512 v[C];
      Row::load(pv + row(t), v);
      for (int j = 0; j < G; ++j) {
        const __m512 p = _mm512_set1_ps(sc[j * stride + t]);
        for (int c = 0; c < CC; ++c) acc[j][c] = _mm512_fmadd_ps(p, v[c0 + c], acc[j][c]);
      }
    }
    for (int j = 0; j < G; ++j)
      for (int c = 0; c < CC; ++c) _mm512_store_ps(o + j * D + 16 * (c0 + c), acc[j][c]);
  }
  for (int j = 0; j < G; ++j)
    for (int i = 0; i < D; ++i) out[j * D + i] = static_cast<A>(o[j * D + Row::at(i)]);
}

template <typename A, typename P>
using HeadFn = void (*)(const float*, const P*, const P*, const int64_t*, int64_t, int64_t,
                        int64_t, int64_t, float*, int64_t, A*, Ahead&);

// head_v for this head size and group, or null where the general loops run
template <typename A, typename P>
HeadFn<A, P> head_fn(int64_t d, int64_t group) {
  return by_shape<HeadFn<A, P>>(d, group, [](auto D, auto G) -> HeadFn<A, P> {
    return head_v<A, P, decltype(D)::value, decltype(G)::value>;
  });
}
#endif

void check_rows(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the cpu");
  TORCH_CHECK(t.stride(-1) == 1, name, " must be contiguous in its last dimension");
}

// ---- K/V into the paged pool ----------------------------------------------------------------

// Every one of the n slots os[] written lies in the pool's ``slots`` rows: a slot outside them
// would write past the pool's memory.
void check_out_slots(const int64_t* os, int64_t n, int64_t slots, const char* op) {
  for (int64_t t = 0; t < n; ++t)
    TORCH_CHECK(os[t] >= 0 && os[t] < slots, op, ": slot ", os[t], " outside 0..", slots - 1);
}

// pool_k[out_slots[t]] = k[t] and pool_v[out_slots[t]] = v[t] for the T rows (k, v [T, kv_heads,
// d], rows at their strides), cast to the pool's dtype as torch casts (a copy where the dtypes
// are the same, as index_copy_ copies); the rows shared among the threads where there are many
// (a prefill chunk's).
template <typename A, typename P>
void write_kv(const Tensor& k, const Tensor& v, Tensor& pool_k, Tensor& pool_v,
              const int64_t* os) {
  const int64_t T = k.size(0), KVH = pool_k.size(1), d = pool_k.size(2);
  const A* kn = k.data_ptr<A>();
  const A* vn = v.data_ptr<A>();
  P* pk = pool_k.data_ptr<P>();
  P* pv = pool_v.data_ptr<P>();
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);
  const bool copy = std::is_same_v<A, P> && ks2 == 1 && vs2 == 1;
  at::parallel_for(0, T, std::max<int64_t>(1, 16384 / (KVH * d)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < KVH; ++h) {
        P* kr = pk + (os[t] * KVH + h) * d;
        P* vr = pv + (os[t] * KVH + h) * d;
        const A* ks = kn + t * ks0 + h * ks1;
        const A* vs = vn + t * vs0 + h * vs1;
        if (copy) {
          std::memcpy(kr, ks, d * sizeof(P));
          std::memcpy(vr, vs, d * sizeof(P));
          continue;
        }
        for (int64_t i = 0; i < d; ++i) {
          kr[i] = static_cast<P>(f32(ks[i * ks2]));
          vr[i] = static_cast<P>(f32(vs[i * vs2]));
        }
      }
    }
  });
}

// k, v: [T, kv_heads, d] (rows may be strided, e.g. views of the fused QKV product) into
// pool_k/pool_v [slots, kv_heads, d] at out_slots [T]: kernels.attention.store_kv, natively.
void store_kv(const Tensor& k, const Tensor& v, Tensor& pool_k, Tensor& pool_v,
              const Tensor& out_slots) {
  TORCH_CHECK(k.device().is_cpu() && v.device().is_cpu(), "store_kv: k/v on the cpu");
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.dtype() == v.dtype(),
              "store_kv: k and v must be [T, kv_heads, d] alike");
  TORCH_CHECK(pool_k.is_contiguous() && pool_v.is_contiguous() &&
                  pool_k.sizes() == pool_v.sizes() && pool_k.dtype() == pool_v.dtype(),
              "store_kv: the pool's K and V must be contiguous and alike");
  TORCH_CHECK(pool_k.dim() == 3 && k.size(1) == pool_k.size(1) && k.size(2) == pool_k.size(2),
              "store_kv: k is ", k.sizes(), ", the pool's rows ", pool_k.sizes());
  TORCH_CHECK(out_slots.scalar_type() == at::kLong && out_slots.is_contiguous() &&
                  out_slots.dim() == 1 && out_slots.size(0) == k.size(0),
              "store_kv: out_slots must be int64 [T], one a row");
  const int64_t* os = out_slots.data_ptr<int64_t>();
  check_out_slots(os, k.size(0), pool_k.size(0), "store_kv");
  by_dtypes(k.scalar_type(), pool_k.scalar_type(), "store_kv", [&](auto a, auto p) {
    write_kv<decltype(a), decltype(p)>(k, v, pool_k, pool_v, os);
  });
}

// ---- decode attention over the paged pool -------------------------------------------------

template <typename A, typename P>
void decode_kernel(const Tensor& q, const Tensor& k_new, const Tensor& v_new, Tensor& pool_k,
                   Tensor& pool_v, const Tensor& out_slots, const Tensor& slots,
                   const Tensor& lens, double scale, Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), d = q.size(2);
  const int64_t KVH = pool_k.size(1), group = H / KVH, width = slots.size(1);
  const A* qp = q.data_ptr<A>();
  P* pk = pool_k.data_ptr<P>();
  P* pv = pool_v.data_ptr<P>();
  const int64_t* os = out_slots.data_ptr<int64_t>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  const int64_t* ln = lens.data_ptr<int64_t>();
  A* op = out.data_ptr<A>();
  // q/k/v are read by their strides: views of the fused QKV product, a column of one
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), qs2 = q.stride(2);
  const int64_t ss0 = slots.stride(0), ss1 = slots.stride(1);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(ln[b] >= 1 && ln[b] <= width, "context length ", ln[b], " outside 1..", width);
  write_kv<A, P>(k_new, v_new, pool_k, pool_v, os);  // this step's K/V into the pool (store_kv)
  // A work item is a request (all its KV heads: a slot's rows are adjacent, read as one
  // stream) or, with fewer requests than threads, one KV head of a request.
  const int64_t split = B < at::get_num_threads() ? KVH : 1, hs = KVH / split;
  const int64_t rows = hs * group;  // query heads of one item
  const int64_t work = B * split;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, width * d * rows));
  constexpr int64_t ahead = 16;  // slots prefetched ahead: a page of one slot is anywhere
  const int64_t bytes = hs * d * static_cast<int64_t>(sizeof(P));  // an item's rows of a slot
  [[maybe_unused]] const bool vec = d % 16 == 0;
#if defined(__AVX512F__)
  const HeadFn<A, P> head = head_fn<A, P>(d, group);
#endif
  const int64_t stride = (width + 15) / 16 * 16;  // head_v's rows of scores
  at::parallel_for(0, work, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(rows * d), scores(rows * stride), acc(rows * d);
    Ahead next;
    next.bytes = bytes;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / split, h0 = (item % split) * hs, len = ln[b];
      for (int64_t r = 0; r < rows; ++r) {
        const A* qr = qp + b * qs0 + (h0 * group + r) * qs1;
        // the query in the pool's dtype, then scaled (grouped_decode's q.to(k.dtype) * scale)
        for (int64_t i = 0; i < d; ++i)
          qf[r * d + i] = f32(static_cast<P>(f32(qr[i * qs2]))) * static_cast<float>(scale);
      }
      const int64_t* srow = sl + b * ss0;
#if defined(__AVX512F__)
      if (head != nullptr) {  // a KV head at a time: the same bits however the items split
        next.rows.clear();
        next.i = next.off = 0;
        if (item + 1 < end) {
          const int64_t nb = (item + 1) / split, nh = ((item + 1) % split) * hs;
          for (int64_t t = 0; t < ln[nb]; ++t) {
            const int64_t at = (sl[nb * ss0 + t * ss1] * KVH + nh) * d;
            next.rows.push_back(reinterpret_cast<const char*>(pk + at));
            next.rows.push_back(reinterpret_cast<const char*>(pv + at));
          }
        }
        for (int64_t h = h0; h < h0 + hs; ++h)
          head(qf.data() + (h - h0) * group * d, pk, pv, srow, ss1, KVH, h, len, scores.data(),
               stride, op + (b * H + h * group) * d, next);
        continue;
      }
#endif
      for (int64_t t = 0; t < len; ++t) {
        if (t + ahead < len) {  // this slot's K rows soon, its V rows for the second pass
          const int64_t at = (srow[(t + ahead) * ss1] * KVH + h0) * d;
          const char* nk = reinterpret_cast<const char*>(pk + at);
          const char* nv = reinterpret_cast<const char*>(pv + at);
          for (int64_t off = 0; off < bytes; off += 64) {
            __builtin_prefetch(nk + off, 0, 3);
            __builtin_prefetch(nv + off, 0, 2);
          }
        }
        const P* kr = pk + (srow[t * ss1] * KVH + h0) * d;
#if defined(__AVX512F__)
        if (vec) {
          slot_scores_v(qf.data(), kr, rows, group, d, &scores[t], width);
          continue;
        }
#endif
        slot_scores(qf.data(), kr, rows, group, d, &scores[t], width);
      }
      for (int64_t r = 0; r < rows; ++r) {
#if defined(__AVX512F__)
        softmax_row_v(&scores[r * width], len);
#else
        softmax_row(&scores[r * width], len);
#endif
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const P* vr = pv + (srow[t * ss1] * KVH + h0) * d;
#if defined(__AVX512F__)
        if (vec) {
          slot_accumulate_v(&scores[t], width, vr, rows, group, d, acc.data());
          continue;
        }
#endif
        slot_accumulate(&scores[t], width, vr, rows, group, d, acc.data());
      }
      for (int64_t r = 0; r < rows; ++r) {
        A* o = op + (b * H + h0 * group + r) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = static_cast<A>(acc[r * d + i]);
      }
    }
  });
}

// q, k_new, v_new: [B, heads | kv_heads, d] (rows may be strided); pool_k/pool_v: [slots,
// kv_heads, d], written at out_slots then read; slots: [B, width] the context's pool slots;
// lens: [B] context lengths (this token included). Returns [B, heads, d] in q's dtype.
Tensor decode_attention(const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                        Tensor& pool_k, Tensor& pool_v, const Tensor& out_slots,
                        const Tensor& slots, const Tensor& lens, double scale) {
  for (auto* t : {&q, &k_new, &v_new}) TORCH_CHECK(t->device().is_cpu(), "q/k/v on the cpu");
  TORCH_CHECK(q.dim() == 3 && k_new.dim() == 3 && v_new.dim() == 3, "q, k, v must be 3-D");
  TORCH_CHECK(pool_k.is_contiguous() && pool_v.is_contiguous(), "the pool must be contiguous");
  TORCH_CHECK(pool_k.sizes() == pool_v.sizes() && pool_k.dtype() == pool_v.dtype(),
              "pool K and V differ");
  TORCH_CHECK(q.size(1) % pool_k.size(1) == 0, "heads must be a multiple of kv_heads");
  TORCH_CHECK(k_new.size(1) == pool_k.size(1) && q.size(2) == pool_k.size(2), "shape mismatch");
  TORCH_CHECK(k_new.dtype() == q.dtype() && v_new.dtype() == q.dtype(), "q/k/v dtypes differ");
  TORCH_CHECK(out_slots.scalar_type() == at::kLong && slots.scalar_type() == at::kLong &&
                  lens.scalar_type() == at::kLong, "indices must be int64");
  TORCH_CHECK(out_slots.is_contiguous() && lens.is_contiguous(), "indices must be contiguous");
  TORCH_CHECK(slots.size(0) == q.size(0) && lens.size(0) == q.size(0) &&
                  out_slots.size(0) == q.size(0), "one row a request");
  check_out_slots(out_slots.data_ptr<int64_t>(), q.size(0), pool_k.size(0), "decode_attention");
  Tensor out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  by_dtypes(q.scalar_type(), pool_k.scalar_type(), "decode_attention", [&](auto a, auto p) {
    decode_kernel<decltype(a), decltype(p)>(q, k_new, v_new, pool_k, pool_v, out_slots, slots,
                                            lens, scale, out);
  });
  return out;
}

// Whether decode_attention attends q's heads over this pool a KV head at a time (head_v) or by
// the general loops: what the boot receipt says runs.
bool decode_by_kv_head(const Tensor& q, const Tensor& pool_k) {
  TORCH_CHECK(q.dim() == 3 && pool_k.dim() == 3, "q [B, heads, d], pool_k [slots, kv_heads, d]");
  TORCH_CHECK(q.size(1) % pool_k.size(1) == 0, "heads must be a multiple of kv_heads");
#if defined(__AVX512F__)
  const int64_t d = q.size(2), group = q.size(1) / pool_k.size(1);
  return by_dtypes(q.scalar_type(), pool_k.scalar_type(), "decode_by_kv_head",
                   [&](auto a, auto p) {
                     return head_fn<decltype(a), decltype(p)>(d, group) != nullptr;
                   });
#else
  return false;
#endif
}

// ---- the small per-layer ops ---------------------------------------------------------------

#if defined(__AVX512F__)
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(c10::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_packed(v));
}
template <typename T>
inline __m512 keep16(__m512 v) {  // v rounded to T and back, as keep<T> a lane at a time
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return widen16(bf16_packed(v));
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ATTEST_ROWS_V 1  // the norm's and rope's vector loops
// the first k of 16 lanes (k >= 16: all), for a row's last, partial vector
inline __mmask16 lanes(int64_t k) {
  return k >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << k) - 1);
}
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const c10::BFloat16* p, __mmask16 m) {  // lanes off read 0
  return widen16(_mm256_maskz_loadu_epi16(m, p));
}
inline void store16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
inline void store16(c10::BFloat16* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, bf16_packed(v));
}

// One row of norm_rows, 16 columns a vector: the same roundings; the sum of squares adds in
// 16 lanes, then across them (the scalar loop adds column by column: another order again).
template <typename T>
inline void norm_row_v(T* xr, const T* rr, const T* w, T* yr, int64_t n, float eps, float* buf) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    __m512 v = load16(xr + i, m);
    if (rr) {
      v = keep16<T>(_mm512_add_ps(v, load16(rr + i, m)));
      store16(xr + i, v, m);
    }
    _mm512_storeu_ps(buf + i, v);
    acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
  }
  const __m512 inv =
      _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(n) + eps));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512 normed = keep16<T>(_mm512_mul_ps(_mm512_loadu_ps(buf + i), inv));
    store16(yr + i, _mm512_mul_ps(load16(w + i, m), normed), m);
  }
}
#endif

// y = w * (x * rsqrt(mean(x^2) + eps)) rounded as fused.rms_norm rounds; with ``residual``,
// first x = x + residual, written back into x (add_norm's new h).
template <typename T>
void norm_rows(T* x, const T* residual, const T* w, T* y, int64_t rows, int64_t n, int64_t xs,
               int64_t rs, int64_t ys, double eps) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t begin, int64_t end) {
    std::vector<float> buf((n + 15) / 16 * 16);
    for (int64_t r = begin; r < end; ++r) {
#if defined(ATTEST_ROWS_V)
      norm_row_v(x + r * xs, residual ? residual + r * rs : nullptr, w, y + r * ys, n,
                 static_cast<float>(eps), buf.data());
      continue;
#endif
      T* xr = x + r * xs;
      float ss = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        float v = f32(xr[i]);
        if (residual) {
          v = keep<T>(v + f32(residual[r * rs + i]));
          xr[i] = static_cast<T>(v);
        }
        buf[i] = v;
        ss += v * v;
      }
      const float inv = 1.f / std::sqrt(ss / (float)n + (float)eps);
      T* yr = y + r * ys;
      for (int64_t i = 0; i < n; ++i) yr[i] = static_cast<T>(f32(w[i]) * keep<T>(buf[i] * inv));
    }
  });
}

Tensor norm_impl(const Tensor& x, const c10::optional<Tensor>& residual, const Tensor& w,
                 double eps) {
  check_rows(x, "x");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 1 && w.size(0) == x.size(1), "x [rows, n], w [n]");
  TORCH_CHECK(w.is_contiguous() && w.dtype() == x.dtype(), "w must be contiguous, x's dtype");
  Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int64_t rows = x.size(0), n = x.size(1);
  int64_t rs = 0;
  if (residual) {
    check_rows(*residual, "residual");
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->dtype() == x.dtype(),
                "residual must match x");
    rs = residual->stride(0);
  }
  if (x.scalar_type() == at::kFloat)
    norm_rows<float>(x.data_ptr<float>(), residual ? residual->data_ptr<float>() : nullptr,
                     w.data_ptr<float>(), y.data_ptr<float>(), rows, n, x.stride(0), rs, n, eps);
  else if (x.scalar_type() == at::kBFloat16)
    norm_rows<c10::BFloat16>(x.data_ptr<c10::BFloat16>(),
                             residual ? residual->data_ptr<c10::BFloat16>() : nullptr,
                             w.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>(), rows, n,
                             x.stride(0), rs, n, eps);
  else
    TORCH_CHECK(false, "rms_norm: dtype ", x.scalar_type());
  return y;
}

// Whether the norm's and rope's rows run in vector loops (a CPU with AVX-512 BW and VL): the
// scalar norm loses to torch's over a prefill's rows, so the engine bounds it there.
bool rows_vectorised() {
#if defined(ATTEST_ROWS_V)
  return true;
#else
  return false;
#endif
}

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  return norm_impl(x, c10::nullopt, w, eps);
}

// h += y in place, then the norm of the new h.
Tensor add_rms_norm(Tensor& h, const Tensor& y, const Tensor& w, double eps) {
  return norm_impl(h, y, w, eps);
}

// silu(gate) * up of gate_up [rows, 2n] (gate a row's first half), as silu_mul computes it in
// torch: silu rounded to T (gate / (1 + exp(-gate)) in float32, exp torch's vector one), then
// the product rounded. One pass where torch makes two and a tensor between them.

#if defined(__AVX512F__)
// silu(g) = g / (1 + exp(-g)) rounded to bfloat16, as the vector loop below computes it, for each
// of the 65,536 bfloat16 values of g (by its bits; one entry more, so a 4-byte gather of the
// last reads inside): a bfloat16 gate's silu is one lookup, the same bits.
const uint16_t* silu_bf16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(65536 + 1, 0);
    const __m512 one = _mm512_set1_ps(1.f), sign = _mm512_set1_ps(-0.f);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int base = 0; base < 65536; base += 16) {
      const __m512i bits = _mm512_add_epi32(_mm512_set1_epi32(base), lane);
      const __m512 gv = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
      const __m512 e = Sleef_expf16_u10(_mm512_xor_ps(gv, sign));
      const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.data() + base),
                          _mm512_cvtepi32_epi16(bf16_bits(s)));
    }
    return t;
  }();
  return table.data();
}
#endif

template <typename T>
void silu_mul_rows(const T* x, T* y, int64_t rows, int64_t n, int64_t xs) {
#if defined(__AVX512F__)
  [[maybe_unused]] const uint16_t* table =
      std::is_same_v<T, c10::BFloat16> ? silu_bf16_table() : nullptr;
#endif
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = x + r * xs;
      const T* u = g + n;
      T* o = y + r * n;
      int64_t i = 0;
#if defined(__AVX512F__)
      // torch's vector loop takes two of its vectors at a time (32 float32, 64 bfloat16), and
      // its scalar loop (std::exp) the rest of a row: the same elements each way here
      constexpr int64_t pair = std::is_same_v<T, float> ? 32 : 64;
      const int64_t whole = n / pair * pair;
      const __m512 one = _mm512_set1_ps(1.f), sign = _mm512_set1_ps(-0.f);
      for (; i < whole; i += 16) {
        if constexpr (std::is_same_v<T, c10::BFloat16>) {  // silu by its table
          const __m256i gb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + i));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i),
                              silu_times16(gb, load16(u + i), table));
          continue;
        }
        const __m512 gv = load16(g + i);
        const __m512 e = Sleef_expf16_u10(_mm512_xor_ps(gv, sign));  // exp(-gate)
        const __m512 s = keep16<T>(_mm512_div_ps(gv, _mm512_add_ps(one, e)));
        store16(o + i, _mm512_mul_ps(s, load16(u + i)));
      }
#endif
      for (; i < n; ++i) o[i] = silu_times<T>(f32(g[i]), f32(u[i]));  // torch's scalar loop
    }
  });
}

Tensor silu_mul(const Tensor& gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up must be [rows, 2n]");
  const int64_t rows = gate_up.size(0), n = gate_up.size(1) / 2;
  Tensor y = at::empty({rows, n}, gate_up.options());
  if (gate_up.scalar_type() == at::kFloat)
    silu_mul_rows<float>(gate_up.data_ptr<float>(), y.data_ptr<float>(), rows, n,
                         gate_up.stride(0));
  else if (gate_up.scalar_type() == at::kBFloat16)
    silu_mul_rows<c10::BFloat16>(gate_up.data_ptr<c10::BFloat16>(),
                                 y.data_ptr<c10::BFloat16>(), rows, n, gate_up.stride(0));
  else
    TORCH_CHECK(false, "silu_mul: dtype ", gate_up.scalar_type());
  return y;
}

// x [T, n, d] in place: x * cos + rotate_half(x) * sin, each product rounded, as apply_rope.
template <typename T>
void rope_rows(Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t rows = x.size(0), n = x.size(1), d = x.size(2), half = d / 2;
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2);
  T* xp = x.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 8192 / (n * d)), [&](int64_t begin, int64_t end) {
    std::vector<float> tmp(d);
    for (int64_t r = begin; r < end; ++r) {
      const T* c = cp + r * d;
      const T* s = sp + r * d;
      for (int64_t hh = 0; hh < n; ++hh) {
        T* v = xp + r * xs0 + hh * xs1;
#if defined(ATTEST_ROWS_V)
        if (xs2 == 1 && half % 16 == 0) {  // 16 pairs a vector, both halves read first
          const __m512 sign = _mm512_set1_ps(-0.f);
          for (int64_t i = 0; i < half; i += 16) {
            const __m512 a = load16(v + i), b = load16(v + half + i);
            const __m512 lo = _mm512_add_ps(
                keep16<T>(_mm512_mul_ps(a, load16(c + i))),
                keep16<T>(_mm512_mul_ps(_mm512_xor_ps(b, sign), load16(s + i))));
            const __m512 hi = _mm512_add_ps(keep16<T>(_mm512_mul_ps(b, load16(c + half + i))),
                                            keep16<T>(_mm512_mul_ps(a, load16(s + half + i))));
            store16(v + i, lo);
            store16(v + half + i, hi);
          }
          continue;
        }
#endif
        for (int64_t i = 0; i < d; ++i) {
          const float rot = i < half ? -f32(v[(i + half) * xs2]) : f32(v[(i - half) * xs2]);
          tmp[i] = keep<T>(keep<T>(f32(v[i * xs2]) * f32(c[i])) + keep<T>(rot * f32(s[i])));
        }
        for (int64_t i = 0; i < d; ++i) v[i * xs2] = static_cast<T>(tmp[i]);
      }
    }
  });
}

Tensor rope_(Tensor& x, const Tensor& cos, const Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu(), "x must be on the cpu");
  TORCH_CHECK(x.dim() == 3 && x.size(2) % 2 == 0, "x must be [T, heads, even head_dim]");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos/sin must be contiguous");
  TORCH_CHECK(cos.numel() == x.size(0) * x.size(2) && sin.numel() == cos.numel(),
              "cos/sin must be [T, 1, head_dim]");
  TORCH_CHECK(cos.dtype() == x.dtype() && sin.dtype() == x.dtype(), "cos/sin must be x's dtype");
  if (x.scalar_type() == at::kFloat)
    rope_rows<float>(x, cos, sin);
  else if (x.scalar_type() == at::kBFloat16)
    rope_rows<c10::BFloat16>(x, cos, sin);
  else
    TORCH_CHECK(false, "rope: dtype ", x.scalar_type());
  return x;
}

// ---- greedy sampling ------------------------------------------------------------------------

// The index of the largest of x[0, n), as torch.argmax gives it: the first of equal maxima, and
// where the row holds a NaN, its first NaN.
inline int64_t argmax_row(const float* x, int64_t n) {
  int64_t i = 0;
#if defined(ATTEST_ROWS_V)
  if (n >= 16) {
    // per lane its largest value and where it first stood (a strictly greater one replaces it)
    __m512 best = _mm512_loadu_ps(x);
    __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i idx = at;
    const __m512i step = _mm512_set1_epi32(16);
    __mmask16 nan = _mm512_cmp_ps_mask(best, best, _CMP_UNORD_Q);
    const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (i = 16; i < n; i += 16) {
      idx = _mm512_add_epi32(idx, step);
      const __mmask16 m = lanes(n - i);
      const __m512 v = _mm512_mask_loadu_ps(ninf, m, x + i);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
      best = _mm512_mask_mov_ps(best, gt, v);
      at = _mm512_mask_mov_epi32(at, gt, idx);
    }
    if (!nan) {
      const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(best));
      const __mmask16 eq = _mm512_cmp_ps_mask(best, top, _CMP_EQ_OQ);
      return _mm512_reduce_min_epi32(
          _mm512_mask_mov_epi32(_mm512_set1_epi32(std::numeric_limits<int32_t>::max()), eq, at));
    }
    i = 0;  // a NaN: the scalar loop finds the first
  }
#endif
  int64_t arg = 0;
  float best = x[0];
  for (i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > best) best = x[i], arg = i;
  }
  return arg;
}

Tensor argmax_rows(const Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kFloat,
              "argmax_rows: x must be a float32 [rows, n] on the cpu");
  TORCH_CHECK(x.size(1) > 0 && x.stride(1) == 1, "argmax_rows: rows of at least one value, dense");
  TORCH_CHECK(x.size(1) <= std::numeric_limits<int32_t>::max(), "argmax_rows: a row too long");
  const int64_t rows = x.size(0), n = x.size(1), xs = x.stride(0);
  Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* p = x.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = argmax_row(p + r * xs, n);
  });
  return out;
}


// ---- a row's k largest ----------------------------------------------------------------------

// Whether a ranks above b in top_rows' order: larger first, a NaN above every number (as
// torch.topk ranks it), equal values by their place (the first above).
inline bool above(float a, int64_t ia, float b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// The indices of the k largest of x[0, n) in that order (k <= n): one pass, each value past the
// first k compared with the k-th held so far (sixteen at a time where the loops are vector ones)
// and placed among them where it ranks above it.
// v and at: k places each, the caller's (kept across its rows).
inline void top_row(const float* x, int64_t n, int64_t k, int64_t* out, float* v, int64_t* at) {
  int64_t held = 0;
  auto place = [&](int64_t i) {  // x[i] among the held, the last dropped where all k are held
    const bool full = held == k;
    int64_t j = full ? k - 1 : held++;
    if (full && !above(x[i], i, v[j], at[j])) return;
    for (; j > 0 && above(x[i], i, v[j - 1], at[j - 1]); --j) v[j] = v[j - 1], at[j] = at[j - 1];
    v[j] = x[i], at[j] = i;
  };
  int64_t i = 0;
  for (; i < std::min(n, k); ++i) place(i);
#if defined(ATTEST_ROWS_V)
  for (; i + 16 <= n; i += 16) {
    const __m512 xs = _mm512_loadu_ps(x + i);
    // above the k-th: greater, or a NaN (an equal value later in the row never is)
    __mmask16 m = _mm512_cmp_ps_mask(xs, xs, _CMP_UNORD_Q);
    if (!std::isnan(v[k - 1])) m |= _mm512_cmp_ps_mask(xs, _mm512_set1_ps(v[k - 1]), _CMP_GT_OQ);
    for (; m; m &= m - 1) place(i + __builtin_ctz(m));
  }
#endif
  for (; i < n; ++i) place(i);
  for (int64_t j = 0; j < k; ++j) out[j] = at[j];
}

Tensor top_rows(const Tensor& x, int64_t k) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kFloat,
              "top_rows: x must be a float32 [rows, n] on the cpu");
  TORCH_CHECK(x.stride(1) == 1, "top_rows: rows must be dense");
  TORCH_CHECK(k >= 1 && k <= x.size(1), "top_rows: k must be 1 to the row's length ", x.size(1),
              ", not ", k);
  const int64_t rows = x.size(0), n = x.size(1), xs = x.stride(0);
  Tensor out = at::empty({rows, k}, x.options().dtype(at::kLong));
  const float* p = x.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / n), [&](int64_t begin, int64_t end) {
    std::vector<float> v(k);
    std::vector<int64_t> at(k);
    for (int64_t r = begin; r < end; ++r) top_row(p + r * xs, n, k, o + r * k, v.data(), at.data());
  });
  return out;
}
}  // namespace attest_ops

using namespace attest_ops;

TORCH_LIBRARY(attest, m) {
  m.def(
      "decode_attention(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!) pool_k, "
      "Tensor(b!) pool_v, Tensor out_slots, Tensor slots, Tensor lens, float scale) -> Tensor");
  m.def(
      "extend_attention(Tensor q, Tensor pool_k, Tensor pool_v, Tensor slots, Tensor prefix, "
      "Tensor starts, Tensor ext, float scale) -> Tensor");
  m.def(
      "store_kv(Tensor k, Tensor v, Tensor(a!) pool_k, Tensor(b!) pool_v, Tensor out_slots) -> ()");
  m.def("decode_by_kv_head(Tensor q, Tensor pool_k) -> bool");
  m.def("extend_way() -> str", &extend_way);
  m.def("set_extend_way(str name) -> str", &set_extend_way);
  m.def("rows_vectorised() -> bool", &rows_vectorised);
  m.def("argmax_rows(Tensor x) -> Tensor");
  m.def("top_rows(Tensor x, int k) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor(a!) h, Tensor y, Tensor w, float eps) -> Tensor");
  m.def("rope_(Tensor(a!) x, Tensor cos, Tensor sin) -> Tensor(a!)");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def(
      "decode_layers(Tensor(a!) h, Tensor x, Tensor cos, Tensor sin, Tensor[] mats, "
      "Tensor[] scales, int[] groups, Tensor[] norms, Tensor(b!)[] pools, Tensor out_slots, "
      "Tensor slots, Tensor lens, int[] dims, float scale, float eps) -> Tensor");
  m.def(
      "dense_layers(Tensor(a!) h, Tensor x, Tensor cos, Tensor sin, Tensor[] mats, int way, "
      "bool native_norm, Tensor[] norms, Tensor(b!)[] pools, Tensor out_slots, Tensor slots, Tensor lens, "
      "int[] dims, float scale, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(attest, CPU, m) {
  m.impl("decode_attention", decode_attention);
  m.impl("extend_attention", extend_attention);
  m.impl("store_kv", store_kv);
  m.impl("decode_by_kv_head", decode_by_kv_head);
  m.impl("rms_norm", rms_norm);
  m.impl("add_rms_norm", add_rms_norm);
  m.impl("rope_", rope_);
  m.impl("silu_mul", silu_mul);
  m.impl("decode_layers", decode_layers);
  m.impl("dense_layers", dense_layers);
  m.impl("argmax_rows", argmax_rows);
  m.impl("top_rows", top_rows);
}

// dense_layers' packed way: the packed copies are oneDNN's tensors, which dispatch by this key
TORCH_LIBRARY_IMPL(attest, MkldnnCPU, m) { m.impl("dense_layers", dense_layers); }
