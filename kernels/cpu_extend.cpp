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

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_ops.h"

namespace attest_ops {

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
  // the items: (request, KV head, kQueries positions), the longest contexts first
  std::vector<std::array<int64_t, 3>> items;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < kvh; ++h)
      for (int64_t j0 = 0; j0 < ex[r]; j0 += kQueries) items.push_back({r, h, j0});
  std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
    return pre[a[0]] + a[2] > pre[b[0]] + b[2];
  });
  const A* qp = q.data_ptr<A>();
  const P* pk = pool_k.data_ptr<P>();
  const P* pv = pool_v.data_ptr<P>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  A* op = out.data_ptr<A>();
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto [r, h, j0] = items[i];
      fn(qp + st[r] * q.stride(0), q.stride(0), q.stride(1), pk, pv, kvh, h,
         sl + r * slots.stride(0), slots.stride(1), pre[r], j0,
         std::min<int64_t>(kQueries, ex[r] - j0), static_cast<float>(scale),
         op + st[r] * out.stride(0), out.stride(0), out.stride(1));
    }
  });
}

}  // namespace
#endif

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
