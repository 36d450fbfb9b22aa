#pragma once
// Fused causal attention on the CPU (backend/attention.hpp's contract): a
// thread takes one head at a time, each query row walks its keys in blocks of
// 64 with flash attention's online softmax, all in fp32. A head's K and V are
// widened to fp32 once, K transposed so that a block's scores are one
// vectorised loop over keys; backward recomputes each block's probabilities
// from the saved log-sum-exp. Working memory per thread: a few [time x dim]
// fp32 tiles, taken from the context's scratch at issue. Strided layouts
// (AttentionShape) cost nothing extra: rows are read and written one at a time.
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <omp.h>

#include "amp/backend/attention.hpp"
#include "amp/backend/host/algorithm.hpp"
#include "amp/core/activation.hpp"

namespace amp {

// Head dimensions up to 256: the size of the kernels' per-row arrays.
template <>
struct fused_attention<host> : std::true_type {
  static constexpr std::int64_t max_dim = 256;
  template <class G, class O>
  static constexpr bool runs = true;  // every type, in fp32 inside
};

// Every shape runs here.
template <class G, class O>
bool attention_available(Context<host>&, const AttentionShape&, float /*dropout*/) {
  return true;
}

namespace detail {
inline constexpr std::int64_t attention_block = 64;  // keys per block
inline constexpr std::int64_t attention_rows = 16;   // query rows per block in backward

inline std::int64_t attention_padded(std::int64_t time) {
  return (time + attention_block - 1) / attention_block * attention_block;
}
// Floats one thread works in: five [padded time x dim] tiles (backward), and
// its query block's rows (q, dO, dQ) and scores (dS, dropout(P)).
inline std::size_t attention_tile_floats(const AttentionShape& s) {
  return static_cast<std::size_t>(5 * attention_padded(s.time) * s.dim + 3 * attention_rows * s.dim +
                                  2 * attention_rows * attention_block);
}

// A head's [time x dim] rows (`stride` values apart) widened to fp32, as rows
// [padded x dim] and/or columns [dim x padded]; the padding is zeros, so whole
// blocks can be read.
template <class G>
void widen(const G* from, std::int64_t stride, std::int64_t time, std::int64_t dim, float* rows, float* cols) {
  const std::int64_t padded = attention_padded(time);
  for (std::int64_t r = 0; r < padded; ++r)
    for (std::int64_t c = 0; c < dim; ++c) {
      const float v = r < time ? cast<float>(from[r * stride + c]) : 0.0f;
      if (rows) rows[r * dim + c] = v;
      if (cols) cols[c * padded + r] = v;
    }
}

// out[jj] = a . column (j0 + jj) for a whole block: 64 accumulators in
// registers, vectorised over keys. D > 0: the head dimension, known at compile time.
template <int D>
inline void block_dots(const float* __restrict a, const float* __restrict cols, std::int64_t padded, std::int64_t j0,
                       std::int64_t dim, float* __restrict out) {
  const std::int64_t d = D > 0 ? D : dim;
  float acc[attention_block] = {};
  for (std::int64_t e = 0; e < d; ++e) {
    const float ae = a[e];
    const float* c = cols + e * padded + j0;
    for (std::int64_t jj = 0; jj < attention_block; ++jj) acc[jj] += ae * c[jj];
  }
  for (std::int64_t jj = 0; jj < attention_block; ++jj) out[jj] = acc[jj];
}

// out[e] += sum over the first n keys of the block of w[jj] * rows[j0 + jj][e], accumulated in registers.
template <int D>
inline void block_weighted_rows(const float* __restrict w, const float* __restrict rows, std::int64_t j0,
                                std::int64_t n, std::int64_t dim, float* __restrict out) {
  const std::int64_t d = D > 0 ? D : dim;
  float acc[D > 0 ? D : fused_attention<host>::max_dim];
  for (std::int64_t e = 0; e < d; ++e) acc[e] = out[e];
  for (std::int64_t jj = 0; jj < n; ++jj) {
    const float wj = w[jj];
    const float* r = rows + (j0 + jj) * d;
    for (std::int64_t e = 0; e < d; ++e) acc[e] += wj * r[e];
  }
  for (std::int64_t e = 0; e < d; ++e) out[e] = acc[e];
}

template <int D, class G, class O, class Dropout>
AMP_HOST_CLONES void attention_forward_head(const AttentionShape& s, std::int64_t h, const G* q, const G* k,
                                            const G* v, O* out, float* lse, const Dropout& drop, std::uint64_t key,
                                            float* work) {
  constexpr std::int64_t B = attention_block;
  const std::int64_t T = s.time, d = D > 0 ? D : s.dim, padded = attention_padded(T);
  const std::int64_t si = s.in_rows(), so = s.out_rows(), in = s.head_start(h, si);
  O* const o = out + s.head_start(h, so);
  float* kt = work;            // K^T [dim x padded]
  float* vr = kt + padded * d;  // V [padded x dim]
  widen(k + in, si, T, d, nullptr, kt);
  widen(v + in, si, T, d, vr, nullptr);
  float qs[D > 0 ? D : fused_attention<host>::max_dim], acc[D > 0 ? D : fused_attention<host>::max_dim], w[B];
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t e = 0; e < d; ++e) qs[e] = s.alpha * cast<float>(q[in + t * si + e]), acc[e] = 0.0f;
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
    for (std::int64_t j0 = 0; j0 <= t; j0 += B) {
      block_dots<D>(qs, kt, padded, j0, d, w);
      float block_max = m;
#pragma omp simd reduction(max : block_max)
      for (std::int64_t jj = 0; jj < B; ++jj) block_max = j0 + jj <= t && w[jj] > block_max ? w[jj] : block_max;
      const float rescale = exp_poly(m - block_max);  // first block: scales l = 0 and acc = 0
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (std::int64_t jj = 0; jj < B; ++jj) {
        const float p = j0 + jj <= t ? exp_poly(w[jj] - block_max) : 0.0f;
        sum += p;
        w[jj] = p;
      }
      l = l * rescale + sum;
      m = block_max;
      const std::int64_t n = t + 1 - j0 < B ? t + 1 - j0 : B;
      if (drop.p > 0.0f)
        for (std::int64_t jj = 0; jj < n; ++jj) w[jj] = drop.keep(key, h * T + t, j0 + jj) ? w[jj] * drop.keep_scale : 0.0f;
      for (std::int64_t e = 0; e < d; ++e) acc[e] *= rescale;
      block_weighted_rows<D>(w, vr, j0, n, d, acc);
    }
    const float inv = 1.0f / l;
    for (std::int64_t e = 0; e < d; ++e) o[t * so + e] = cast<O>(acc[e] * inv);
    lse[h * T + t] = m + std::log(l);
  }
}

// Backward in blocks of 16 query rows x 64 keys: each block's dS and
// dropout(P) are made once, then dQ gathers them per row and dK, dV per key
// (one read-modify-write of a key's row per block, not per query row).
template <int D, class G, class O, class Dv, class Dropout>
AMP_HOST_CLONES void attention_backward_head(const AttentionShape& s, std::int64_t h, const G* q, const G* k,
                                             const G* v, const O* out, const float* lse, const G* dout, Dv* dq, Dv* dk,
                                             Dv* dv, const Dropout& drop, std::uint64_t key, float* work) {
  constexpr std::int64_t B = attention_block, R = attention_rows;
  const std::int64_t T = s.time, d = D > 0 ? D : s.dim, padded = attention_padded(T);
  const std::int64_t si = s.in_rows(), so = s.out_rows(), in = s.head_start(h, si), at_out = s.head_start(h, so);
  float* kt = work;              // K^T, V^T [dim x padded]
  float* vt = kt + padded * d;
  float* kr = vt + padded * d;   // K, dK, dV [padded x dim]
  float* dkr = kr + padded * d;
  float* dvr = dkr + padded * d;
  float* qs = dvr + padded * d;  // the query block's alpha q, dO and dQ / alpha [R x dim]
  float* g = qs + R * d;
  float* dqr = g + R * d;
  float* ds = dqr + R * d;       // its dS and dropout(P) [R x B]
  float* pd = ds + R * B;
  widen(k + in, si, T, d, kr, kt);
  widen(v + in, si, T, d, nullptr, vt);
  for (std::int64_t i = 0; i < padded * d; ++i) dkr[i] = 0.0f, dvr[i] = 0.0f;
  const float keep_scale = drop.p > 0.0f ? drop.keep_scale : 1.0f;
  float delta[R], dp[B];
  for (std::int64_t i0 = 0; i0 < T; i0 += R) {
    const std::int64_t rows = T - i0 < R ? T - i0 : R;
    for (std::int64_t ii = 0; ii < rows; ++ii) {
      delta[ii] = 0.0f;  // sum_j P_j dP_j = dO . O
      for (std::int64_t e = 0; e < d; ++e) {
        const std::int64_t at = at_out + (i0 + ii) * so + e;
        qs[ii * d + e] = s.alpha * cast<float>(q[in + (i0 + ii) * si + e]);
        g[ii * d + e] = cast<float>(dout[at]);
        delta[ii] += g[ii * d + e] * cast<float>(out[at]);
        dqr[ii * d + e] = 0.0f;
      }
    }
    for (std::int64_t j0 = 0; j0 < i0 + rows; j0 += B) {
      for (std::int64_t ii = 0; ii < rows; ++ii) {
        const std::int64_t t = i0 + ii, row = h * T + t;
        float* dsi = ds + ii * B;
        float* pdi = pd + ii * B;
        block_dots<D>(qs + ii * d, kt, padded, j0, d, dsi);  // scores
        block_dots<D>(g + ii * d, vt, padded, j0, d, dp);    // dO . v_j
        const float lse_t = lse[row], delta_t = delta[ii];
#pragma omp simd
        for (std::int64_t jj = 0; jj < B; ++jj) {
          const float p = j0 + jj <= t ? exp_poly(dsi[jj] - lse_t) : 0.0f;
          dsi[jj] = p * (dp[jj] * keep_scale - delta_t);
          pdi[jj] = p * keep_scale;
        }
        if (drop.p > 0.0f)  // a dropped entry: dP = 0, so dS = -P delta
          for (std::int64_t jj = 0; jj < B && j0 + jj <= t; ++jj)
            if (!drop.keep(key, row, j0 + jj)) dsi[jj] = -(pdi[jj] / keep_scale) * delta_t, pdi[jj] = 0.0f;
        block_weighted_rows<D>(dsi, kr, j0, B, d, dqr + ii * d);
      }
      const std::int64_t keys = T - j0 < B ? T - j0 : B;
      for (std::int64_t jj = 0; jj < keys; ++jj) {
        const std::int64_t j = j0 + jj;
        float dk_acc[D > 0 ? D : fused_attention<host>::max_dim], dv_acc[D > 0 ? D : fused_attention<host>::max_dim];
        for (std::int64_t e = 0; e < d; ++e) dk_acc[e] = dkr[j * d + e], dv_acc[e] = dvr[j * d + e];
        for (std::int64_t ii = 0; ii < rows; ++ii) {
          const float dsj = ds[ii * B + jj], pdj = pd[ii * B + jj];
          for (std::int64_t e = 0; e < d; ++e) dk_acc[e] += dsj * qs[ii * d + e], dv_acc[e] += pdj * g[ii * d + e];
        }
        for (std::int64_t e = 0; e < d; ++e) dkr[j * d + e] = dk_acc[e], dvr[j * d + e] = dv_acc[e];
      }
    }
    for (std::int64_t ii = 0; ii < rows; ++ii)
      for (std::int64_t e = 0; e < d; ++e) dq[in + (i0 + ii) * si + e] = cast<Dv>(s.alpha * dqr[ii * d + e]);
  }
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t e = 0; e < d; ++e)
      dk[in + t * si + e] = cast<Dv>(dkr[t * d + e]), dv[in + t * si + e] = cast<Dv>(dvr[t * d + e]);
}

// f(integral_constant<int, D>): D the head dimension where a compiled-in size fits, else 0 (any, at run time).
template <class F>
void with_head_dim(std::int64_t dim, F f) {
  switch (dim) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: f(std::integral_constant<int, 0>{});
  }
}

// One head per item, each thread on its own tiles; heads x time^2 x dim is the work.
template <class F>
void attention_heads(Context<host>& ctx, const AttentionShape& s, F per_head) {
  AMP_REQUIRE(s.dim > 0 && s.dim <= fused_attention<host>::max_dim && s.time > 0 && s.heads > 0,
              "fused attention: head dimension ", s.dim, " (at most ", fused_attention<host>::max_dim, "), time ",
              s.time, ", heads ", s.heads);
  const std::size_t tile = attention_tile_floats(s);
  float* tiles = ctx.scratch<float>(scratch_slot::attention, tile * static_cast<std::size_t>(ctx.threads()));
  ctx.count_launch();
  ctx.issue([threads = ctx.threads(), s, per_head, tiles, tile] {
    const std::uint64_t key = per_head.key();
    with_head_dim(s.dim, [&](auto dim) {
#pragma omp parallel for num_threads(threads) schedule(static) \
    if (s.heads > 1 && s.time * s.time * s.dim >= host_parallel_threshold / 4)
      for (std::int64_t h = 0; h < s.heads; ++h)
        per_head.template run<decltype(dim)::value>(h, key, tiles + tile * static_cast<std::size_t>(omp_get_thread_num()));
    });
  });
}
}  // namespace detail

namespace detail {
template <class G, class O, class Dropout>
struct AttentionForwardHeads {
  AttentionShape s;
  const G *q, *k, *v;
  O* out;
  float* lse;
  Dropout drop;
  std::uint64_t key() const { return drop.p > 0.0f ? drop.key() : 0; }
  template <int D>
  void run(std::int64_t h, std::uint64_t key, float* work) const {
    attention_forward_head<D>(s, h, q, k, v, out, lse, drop, key, work);
  }
};

template <class G, class O, class Dg, class Dropout>
struct AttentionBackwardHeads {
  AttentionShape s;
  const G *q, *k, *v;
  const O* out;
  const float* lse;
  const G* dout;
  Dg *dq, *dk, *dv;
  Dropout drop;
  std::uint64_t key() const { return drop.p > 0.0f ? drop.key() : 0; }
  template <int D>
  void run(std::int64_t h, std::uint64_t key, float* work) const {
    attention_backward_head<D>(s, h, q, k, v, out, lse, dout, dq, dk, dv, drop, key, work);
  }
};
}  // namespace detail

// O [heads x time x dim] (laid out as s says) in O's type and lse [heads x time] (fp32), overwritten.
template <class G, class O, class Dropout>
void attention_forward(Context<host>& ctx, const AttentionShape& s, const G* q, const G* k, const G* v, O* out,
                       float* lse, Dropout drop) {
  detail::attention_heads(ctx, s, detail::AttentionForwardHeads<G, O, Dropout>{s, q, k, v, out, lse, drop});
}

// dQ, dK, dV [heads x time x dim] (laid out as Q, K, V) in Dg's type, overwritten, from dO (in G),
// the forward's O and lse, and the same Dropout.
template <class G, class O, class Dg, class Dropout>
void attention_backward(Context<host>& ctx, const AttentionShape& s, const G* q, const G* k, const G* v, const O* out,
                        const float* lse, const G* dout, Dg* dq, Dg* dk, Dg* dv, Dropout drop) {
  detail::attention_heads(
      ctx, s, detail::AttentionBackwardHeads<G, O, Dg, Dropout>{s, q, k, v, out, lse, dout, dq, dk, dv, drop});
}

}  // namespace amp
