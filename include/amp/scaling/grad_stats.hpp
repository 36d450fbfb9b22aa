#pragma once
// The overflow check: one reduction over a flat gradient arena yields, in a
// single read, whether any gradient is inf/NaN, their sum of squares (the
// global norm for clipping) and the largest |g|. Squares are summed in fp64
// (per thread on the CPU, per block and across blocks on the GPU), so the norm
// is right to fp32 rounding far beyond 10^9 elements; an fp32 sum stops
// growing near 2^24 times a typical term.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "amp/backend/buffer.hpp"
#include "amp/backend/tensor_chunks.hpp"
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
  // The CPU's fold of a run (the host's transform_reduce asks for it): each
  // field its own vector reduction, fp64 sums per lane; the GPU combines
  // pairs in CUB's tree instead.
  template <class G>
  GradStats fold(const GradStatsOf<G>& map, std::size_t begin, std::size_t end) const {
    double sumsq = 0.0;
    float maxabs = 0.0f;
    int nonfinite = 0;
    const auto first = static_cast<std::int64_t>(begin), last = static_cast<std::int64_t>(end);
#pragma omp simd reduction(+ : sumsq, nonfinite) reduction(max : maxabs)
    for (std::int64_t i = first; i < last; ++i) {
      const GradStats s = map(static_cast<std::size_t>(i));
      sumsq += s.sumsq;
      maxabs = maxabs > s.maxabs ? maxabs : s.maxabs;
      nonfinite += s.nonfinite;
    }
    return {sumsq, maxabs, nonfinite};
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
// The backend's transform_reduce: on the CPU fixed chunks folded as vector
// reductions (deterministic for any thread count), on the GPU CUB's.
template <class Ctx, class G>
void grad_stats(Ctx& ctx, Span<const G> grads, GradStats* out) {
  transform_reduce(ctx, grads.size, detail::GradStatsOf<G>{grads.data}, detail::CombineGradStats{}, GradStats{}, out);
}

namespace detail {
// *total = (first ? nothing : *total) combined with every tensor's, in order.
struct TotalStatsOp {
  const GradStats* tensors;
  std::size_t count;
  GradStats* total;
  bool first;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    GradStats s = first ? GradStats{} : *total;
    for (std::size_t t = 0; t < count; ++t) s = CombineGradStats{}(s, tensors[t]);
    *total = s;
  }
};
}  // namespace detail

// The statistics of each tensor of a gradient arena (per-tensor norms) and
// their total, in three launches however many tensors: the chunks, each
// tensor's chunks in order (backend/tensor_chunks.hpp), then the tensors in
// order into the total. Deterministic: the chunks depend on the sizes alone.
template <Backend B>
class TensorStats {
 public:
  TensorStats() = default;
  // Tensor t is elements [offsets[t], offsets[t] + counts[t]) of the span the call reads.
  TensorStats(Context<B>& ctx, const std::vector<std::size_t>& offsets, const std::vector<std::size_t>& counts)
      : chunks_(ctx, offsets, counts), chunk_stats_(ctx, chunks_.chunks(), memory_kind::optimizer) {}

  std::size_t tensors() const { return chunks_.tensors(); }

  // per_tensor[t] = tensor t's statistics; *total = them combined, after
  // (unless first) what it held. Nothing at all without tensors.
  template <class G>
  void operator()(Context<B>& ctx, Span<const G> grads, GradStats* per_tensor, GradStats* total, bool first) const {
    if (tensors() == 0) return;
    chunks_.reduce(ctx, detail::GradStatsOf<G>{grads.data}, detail::CombineGradStats{}, GradStats{}, chunk_stats_.data(),
                   per_tensor);
    for_each(ctx, 1, detail::TotalStatsOp{per_tensor, tensors(), total, first});
  }

 private:
  TensorChunks<B> chunks_;
  Buffer<GradStats, B> chunk_stats_;
};

}  // namespace amp
