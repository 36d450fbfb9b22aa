#pragma once
// The overflow check: one reduction over a flat gradient arena yields, in a
// single read, whether any gradient is inf/NaN, their sum of squares (the
// global norm for clipping) and the largest |g|. Squares are summed in fp64
// (per thread on the CPU, per block and across blocks on the GPU), so the norm
// is right to fp32 rounding far beyond 10^9 elements; an fp32 sum stops
// growing near 2^24 times a typical term.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "amp/backend/host/algorithm.hpp"
#include "amp/core/numeric.hpp"
#include "amp/core/span.hpp"

namespace amp {

struct GradStats {
  double sumsq = 0.0;
  float maxabs = 0.0f;
  int nonfinite = 0;
};

// Skip the step: a non-finite gradient, or a norm too large for fp32.
AMP_HOST_DEVICE inline bool overflowed(const GradStats& s) {
  return s.nonfinite != 0 || !(s.sumsq <= 3.4028234663852886e38);
}

namespace detail {
template <class G>
struct GradStatsOf {
  const G* g;
  AMP_HOST_DEVICE GradStats operator()(std::size_t i) const {
    // Branch-free, so the host loop vectorises.
    const float v = cast<float>(g[i]);
    const bool finite = is_finite(v);
    const float a = finite ? fabsf(v) : 0.0f;
    return {static_cast<double>(a) * a, a, finite ? 0 : 1};
  }
};

struct CombineGradStats {
  AMP_HOST_DEVICE GradStats operator()(const GradStats& a, const GradStats& b) const {
    return {a.sumsq + b.sumsq, fmaxf(a.maxabs, b.maxabs), a.nonfinite + b.nonfinite};
  }
};

// into (+)= from, on the device: the stats of several arenas as one.
struct AddGradStatsOp {
  GradStats* into;
  const GradStats* from;
  bool first;
  AMP_HOST_DEVICE void operator()(std::size_t) const { *into = first ? *from : CombineGradStats{}(*into, *from); }
};
}  // namespace detail

// Writes the statistics of `grads` to `out` (backend memory); no host sync.
// On the CPU an OpenMP SIMD reduction (fp64 sums per lane; deterministic for a
// given thread count), on the GPU CUB's (see transform_reduce).
namespace detail {
template <class G>
AMP_HOST_CLONES void grad_stats_now(int threads, Span<const G> grads, GradStats* out) {
  double sumsq = 0.0;
  float maxabs = 0.0f;
  int nonfinite = 0;
  const GradStatsOf<G> map{grads.data};
  const auto n = static_cast<std::int64_t>(grads.size);
#pragma omp parallel for simd num_threads(threads) reduction(+ : sumsq, nonfinite) reduction(max : maxabs) \
    if (n >= host_parallel_threshold)
  for (std::int64_t i = 0; i < n; ++i) {
    const GradStats s = map(static_cast<std::size_t>(i));
    sumsq += s.sumsq;
    maxabs = maxabs > s.maxabs ? maxabs : s.maxabs;
    nonfinite += s.nonfinite;
  }
  *out = {sumsq, maxabs, nonfinite};
}
}  // namespace detail

template <class G>
void grad_stats(Context<host>& ctx, Span<const G> grads, GradStats* out) {
  ctx.count_launch();
  ctx.issue([threads = ctx.threads(), grads, out] { detail::grad_stats_now(threads, grads, out); });
}

template <class Ctx, class G>
void grad_stats(Ctx& ctx, Span<const G> grads, GradStats* out) {
  transform_reduce(ctx, grads.size, detail::GradStatsOf<G>{grads.data}, detail::CombineGradStats{}, GradStats{}, out);
}

}  // namespace amp
