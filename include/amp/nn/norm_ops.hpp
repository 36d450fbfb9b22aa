#pragma once
// The per-element math of the normalisation layers (nn/norm.hpp), for both
// backends: statistics accumulated in fp32 (two passes: the mean, then the
// squared deviations), per column (BatchNorm: a channel over every other
// position) or per row (LayerNorm; RMSNorm is its uncentred case: Centered =
// false reads no mean and has no shift), the normalised value rounded through
// compute_type<norm>, and the backward's sums and input gradients. Ops over
// a row take the backend's lanes (backend/rows.hpp): a warp per row on a GPU.
#include <cmath>
#include <cstdint>

#include "amp/nn/ops.hpp"

namespace amp::nn {

namespace detail {
// Per-channel (column) statistics of x: mean, then variance from the deviations.
template <class T>
struct SquaredDeviationAt {
  const T* x;
  const float* mean;
  std::int64_t cols;
  AMP_HOST_DEVICE float operator()(std::int64_t r, std::int64_t c) const {
    const float d = cast<float>(x[r * cols + c]) - mean[c];
    return d * d;
  }
};
// dy and dy * xhat, summed per column for the backward.
template <class T, bool PerRow, bool Centered = true>
struct GradXhatAt {
  const T* dy;
  const T* x;
  const float* mean;     // per row (LayerNorm) or per column (BatchNorm)
  const float* inv_std;
  std::int64_t cols;
  AMP_HOST_DEVICE float operator()(std::int64_t r, std::int64_t c) const {
    const std::int64_t s = PerRow ? r : c;
    return cast<float>(dy[r * cols + c]) * (cast<float>(x[r * cols + c]) - (Centered ? mean[s] : 0.0f)) * inv_std[s];
  }
};

// The rows behind the statistics: this rank's, or (SyncBatchNorm) a count summed over the ranks.
struct RowCount {
  float local;
  const float* summed;  // nullptr: local
  AMP_HOST_DEVICE float operator()() const { return summed ? *summed : local; }
};

// From column sums to mean and 1/std (training), and the running statistics.
struct BatchStatsOp {
  float* mean;       // in: sum of x; out: mean
  float* var_sum;    // in: sum of squared deviations
  float* inv_std;
  float* running_mean;  // nullptr: leave them (planning, evaluation)
  float* running_var;
  float* batches;       // PyTorch's num_batches_tracked
  RowCount count;
  float eps, momentum;
  AMP_HOST_DEVICE void operator()(std::size_t c) const {
    const float rows = count();
    const float var = var_sum[c] / rows;
    inv_std[c] = 1.0f / sqrtf(var + eps);
    if (running_mean) {
      if (c == 0) *batches += 1.0f;
      running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean[c];
      const float unbiased = rows > 1.0f ? var * rows / (rows - 1.0f) : var;
      running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
    }
  }
};
struct MeanOp {
  float* sum;
  RowCount count;
  AMP_HOST_DEVICE void operator()(std::size_t c) const { sum[c] /= count(); }
};
struct SetOp {
  float* at;
  float value;
  AMP_HOST_DEVICE void operator()(std::size_t) const { *at = value; }
};
struct RunningStatsOp {
  const float* running_mean;
  const float* running_var;
  float* mean;
  float* inv_std;
  float eps;
  AMP_HOST_DEVICE void operator()(std::size_t c) const {
    mean[c] = running_mean[c];
    inv_std[c] = 1.0f / sqrtf(running_var[c] + eps);
  }
};

// Row r: y = round_C((x - mean) inv_std) * gamma + beta, statistics per
// row (LayerNorm) or per column (BatchNorm); a row op (backend/rows.hpp).
// One normalised value: (x - mean) * inv_std, then (Affine) gamma and beta, each rounded through C.
template <class C, bool Centered, bool Affine, class N>
AMP_HOST_DEVICE inline float normalized(float x, float mean, float inv_std, const N* gamma, const N* beta,
                                        std::int64_t c) {
  float v = round_to<C>((x - (Centered ? mean : 0.0f)) * inv_std);
  if constexpr (Affine) v = Centered ? v * cast<float>(gamma[c]) + cast<float>(beta[c]) : v * cast<float>(gamma[c]);
  return round_to<C>(v);
}

// BatchNorm's forward from its per-channel statistics (mean, inv_std per column).
template <class C, class T, class N>
struct NormalizeColumnsOp {
  const T* x;
  T* y;
  const float* mean;
  const float* inv_std;
  const N* gamma;  // nullptr: no affine
  const N* beta;
  std::int64_t cols;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const std::int64_t row = static_cast<std::int64_t>(r);
    const T* in = x + row * cols;
    T* out = y + row * cols;
    with_flag(gamma != nullptr, [&](auto affine) {  // a constant per row: the loop vectorises
      lanes.each(cols, [&](std::int64_t c) {
        out[c] = cast<T>(normalized<C, true, affine>(cast<float>(in[c]), mean[c], inv_std[c], gamma, beta, c));
      });
    });
  }
};

// LayerNorm's forward of row r in one pass over it: the statistics (the mean,
// then the squared deviations; uncentred (RMSNorm): the mean square alone),
// kept for backward, and the normalised row. One launch reads the row while it
// is in cache (on a GPU, in the warp's L1) instead of a statistics pass and a
// normalising pass.
template <class C, class T, class N, bool Centered = true>
struct LayerNormForwardOp {
  const T* x;
  T* y;
  float* mean;  // nullptr when uncentred
  float* inv_std;
  const N* gamma;  // nullptr: no affine
  const N* beta;
  std::int64_t cols;
  float eps;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const std::int64_t row = static_cast<std::int64_t>(r);
    const T* in = x + row * cols;
    T* out = y + row * cols;
    const float m =
        Centered ? lanes.sum(cols, [&](std::int64_t c) { return cast<float>(in[c]); }) / static_cast<float>(cols) : 0.0f;
    const float sq = lanes.sum(cols, [&](std::int64_t c) {
      const float d = cast<float>(in[c]) - m;
      return d * d;
    });
    const float inv = 1.0f / sqrtf(sq / static_cast<float>(cols) + eps);
    lanes.each(1, [&](std::int64_t) {
      if (Centered) mean[r] = m;
      inv_std[r] = inv;
    });
    with_flag(gamma != nullptr, [&](auto affine) {
      lanes.each(cols, [&](std::int64_t c) {
        out[c] = cast<T>(normalized<C, Centered, affine>(cast<float>(in[c]), m, inv, gamma, beta, c));
      });
    });
  }
};

// BatchNorm's input gradient in training: gamma inv_std / M (M dy - sum dy - xhat sum(dy xhat)).
template <class C, class T, class N>
struct BatchNormGradOp {
  const T* x;
  const T* dy;
  T* dx;
  const float* mean;
  const float* inv_std;
  const float* sum_dy;
  const float* sum_dy_xhat;
  const N* gamma;
  std::int64_t cols;
  RowCount count;
  bool training, accumulate;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {  // row r, every channel
    const float rows = count();
    const auto base = static_cast<std::size_t>(static_cast<std::int64_t>(r) * cols);
    with_flag(gamma != nullptr, [&](auto affine) {
      with_flag(training, [&](auto train) {
        with_flag(accumulate, [&](auto add) {
          lanes.each(cols, [&](std::int64_t c) {
            const std::size_t i = base + static_cast<std::size_t>(c);
            float scale = inv_std[c];
            if constexpr (affine) scale *= cast<float>(gamma[c]);
            const float g = cast<float>(dy[i]);
            float v = scale * g;
            if constexpr (train) {
              const float xhat = (cast<float>(x[i]) - mean[c]) * inv_std[c];
              v = scale * (g - (sum_dy[c] + xhat * sum_dy_xhat[c]) / rows);
            }
            store_grad(dx, i, round_to<C>(v), add);
          });
        });
      });
    });
  }
};

// gamma (+)= sum dy xhat, beta (+)= sum dy: parameter gradients always accumulate.
template <class N>
struct AffineGradOp {
  const float* sum_dy;
  const float* sum_dy_xhat;
  N* dgamma;
  N* dbeta;  // nullptr: no shift (RMSNorm)
  AMP_HOST_DEVICE void operator()(std::size_t c) const {
    dgamma[c] = cast<N>(cast<float>(dgamma[c]) + sum_dy_xhat[c]);
    if (dbeta) dbeta[c] = cast<N>(cast<float>(dbeta[c]) + sum_dy[c]);
  }
};

// LayerNorm's input gradient of row r: inv_std / D (D dy g - sum(dy g) - xhat
// sum(dy g xhat)) (a row op); uncentred (RMSNorm) without the sum(dy g) term.
template <class C, class T, class N, bool Centered = true>
struct LayerNormGradOp {
  const T* x;
  const T* dy;
  T* dx;
  const float* mean;
  const float* inv_std;
  const N* gamma;
  std::int64_t cols;
  bool accumulate;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const std::int64_t base = static_cast<std::int64_t>(r) * cols;
    const auto g = [&](std::int64_t c) { return cast<float>(dy[base + c]) * (gamma ? cast<float>(gamma[c]) : 1.0f); };
    const auto xhat = [&](std::int64_t c) { return (cast<float>(x[base + c]) - (Centered ? mean[r] : 0.0f)) * inv_std[r]; };
    const float a = Centered ? lanes.sum(cols, g) : 0.0f;
    const float b = lanes.sum(cols, [&](std::int64_t c) { return g(c) * xhat(c); });
    const float d = static_cast<float>(cols);
    lanes.each(cols, [&](std::int64_t c) {
      store_grad(dx, static_cast<std::size_t>(base + c), round_to<C>(inv_std[r] * (g(c) - (a + xhat(c) * b) / d)),
                 accumulate);
    });
  }
};
}  // namespace detail

}  // namespace amp::nn
