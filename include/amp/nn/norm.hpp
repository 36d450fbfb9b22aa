#pragma once
// Normalisation layers. Their scale and shift have the norm role (stored as
// norm_param_type: fp32 under O2, as Apex keeps BatchNorm), statistics are
// accumulated in fp32 (two passes: the mean, then the squared deviations), and
// the normalised value is rounded through compute_type<norm> before it is
// stored as activation_type.
//   BatchNorm: statistics per channel (the last dimension) over every other
//   position, so one class serves [N, C] (BatchNorm1d) and channels-last
//   [N, H, W, C] (BatchNorm2d); fp32 running mean and variance (buffers) for
//   evaluation, updated with momentum in training.
//   With Config::sync (SyncBatchNorm), the sums behind the statistics and the
//   backward's sums are added over every rank, so a per-rank batch of B
//   normalises as one batch of B x ranks (parameter gradients stay per rank:
//   data parallel sums them).
//   LayerNorm: statistics per row over the last dimension.
#include <cmath>
#include <string>

#include "amp/backend/collective.hpp"
#include "amp/model/model.hpp"
#include "amp/nn/ops.hpp"

namespace amp::nn {

namespace detail {
// Per-channel (column) statistics of x: mean, then variance from the deviations.
template <class T>
struct ValueAt {
  const T* x;
  std::int64_t cols;
  AMP_HOST_DEVICE float operator()(std::int64_t r, std::int64_t c) const { return cast<float>(x[r * cols + c]); }
};
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
template <class T>
struct GradAt {
  const T* dy;
  std::int64_t cols;
  AMP_HOST_DEVICE float operator()(std::int64_t r, std::int64_t c) const { return cast<float>(dy[r * cols + c]); }
};
template <class T, bool PerRow>
struct GradXhatAt {
  const T* dy;
  const T* x;
  const float* mean;     // per row (LayerNorm) or per column (BatchNorm)
  const float* inv_std;
  std::int64_t cols;
  AMP_HOST_DEVICE float operator()(std::int64_t r, std::int64_t c) const {
    const std::int64_t s = PerRow ? r : c;
    return cast<float>(dy[r * cols + c]) * (cast<float>(x[r * cols + c]) - mean[s]) * inv_std[s];
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
// row (LayerNorm) or per column (BatchNorm).
template <class C, class T, class N, bool PerRow>
struct NormalizeOp {
  const T* x;
  T* y;
  const float* mean;
  const float* inv_std;
  const N* gamma;  // nullptr: no affine
  const N* beta;
  std::int64_t cols;
  AMP_HOST_DEVICE void operator()(std::size_t r) const {
    const std::int64_t row = static_cast<std::int64_t>(r), width = cols;
    const T* in = x + row * width;
    T* out = y + row * width;
    with_flag(gamma != nullptr, [&](auto affine) {
      for (std::int64_t c = 0; c < width; ++c) {
        const std::int64_t s = PerRow ? row : c;
        float v = round_to<C>((cast<float>(in[c]) - mean[s]) * inv_std[s]);
        if constexpr (affine) v = v * cast<float>(gamma[c]) + cast<float>(beta[c]);
        out[c] = cast<T>(round_to<C>(v));
      }
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
  AMP_HOST_DEVICE void operator()(std::size_t r) const {  // row r, every channel
    const float rows = count();
    const std::int64_t width = cols;
    const auto base = static_cast<std::size_t>(static_cast<std::int64_t>(r) * width);
    with_flag(gamma != nullptr, [&](auto affine) {
      with_flag(training, [&](auto train) {
        with_flag(accumulate, [&](auto add) {
          for (std::int64_t c = 0; c < width; ++c) {
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
          }
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
  N* dbeta;
  AMP_HOST_DEVICE void operator()(std::size_t c) const {
    dgamma[c] = cast<N>(cast<float>(dgamma[c]) + sum_dy_xhat[c]);
    dbeta[c] = cast<N>(cast<float>(dbeta[c]) + sum_dy[c]);
  }
};

// LayerNorm's statistics of row r: mean and 1/std over its cols values.
template <class T>
struct RowStatsOp {
  const T* x;
  float* mean;
  float* inv_std;
  std::int64_t cols;
  float eps;
  AMP_HOST_DEVICE void operator()(std::size_t r) const {
    const T* row = x + static_cast<std::int64_t>(r) * cols;
    float sum = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) sum += cast<float>(row[c]);
    const float m = sum / static_cast<float>(cols);
    float sq = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float d = cast<float>(row[c]) - m;
      sq += d * d;
    }
    mean[r] = m;
    inv_std[r] = 1.0f / sqrtf(sq / static_cast<float>(cols) + eps);
  }
};

// LayerNorm's input gradient of row r: inv_std / D (D dy g - sum(dy g) - xhat sum(dy g xhat)).
template <class C, class T, class N>
struct LayerNormGradOp {
  const T* x;
  const T* dy;
  T* dx;
  const float* mean;
  const float* inv_std;
  const N* gamma;
  std::int64_t cols;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t r) const {
    const std::int64_t base = static_cast<std::int64_t>(r) * cols;
    float a = 0.0f, b = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float g = cast<float>(dy[base + c]) * (gamma ? cast<float>(gamma[c]) : 1.0f);
      const float xhat = (cast<float>(x[base + c]) - mean[r]) * inv_std[r];
      a += g;
      b += g * xhat;
    }
    const float d = static_cast<float>(cols);
    for (std::int64_t c = 0; c < cols; ++c) {
      const float g = cast<float>(dy[base + c]) * (gamma ? cast<float>(gamma[c]) : 1.0f);
      const float xhat = (cast<float>(x[base + c]) - mean[r]) * inv_std[r];
      store_grad(dx, static_cast<std::size_t>(base + c), round_to<C>(inv_std[r] * (g - (a + xhat * b) / d)), accumulate);
    }
  }
};
}  // namespace detail

template <class P, class B>
class BatchNorm {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  using N = typename P::norm_param_type;
  using C = typename P::template compute_type<op::norm>;
  struct Config {
    std::int64_t features = 0;  // channels
    float eps = 1e-5f;
    float momentum = 0.1f;
    bool affine = true;
    Collective<B>* sync = nullptr;  // SyncBatchNorm: statistics over the batches of every rank
  };
  static int torch_slots(const Config&) { return 1; }

  BatchNorm(Builder<P, B> b, const Config& cfg) : name_(b.prefix()) {
    AMP_REQUIRE(cfg.features > 0 && cfg.eps > 0 && cfg.momentum >= 0 && cfg.momentum <= 1, "BatchNorm '", name_,
                "': need features > 0, eps > 0 and momentum in [0, 1]");
    s_.features = cfg.features, s_.eps = cfg.eps, s_.momentum = cfg.momentum, s_.affine = cfg.affine;
    s_.sync = cfg.sync;
    if (cfg.affine) {
      s_.weight = b.template param<role::norm>("weight", {cfg.features}, Init::constant(1.0f), false);
      s_.bias = b.template param<role::norm>("bias", {cfg.features}, Init::constant(0.0f), false);
    }
    s_.running_mean = b.template param<role::buffer>("running_mean", {cfg.features}, Init::constant(0.0f), false);
    s_.running_var = b.template param<role::buffer>("running_var", {cfg.features}, Init::constant(1.0f), false);
    s_.batches = b.template param<role::buffer>("num_batches_tracked", Shape{}, Init::constant(0.0f), false);
  }

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, "BatchNorm '", name_, "'");
    AMP_REQUIRE(x.shape.rank() >= 2 && x.cols() == s_.features, "BatchNorm '", name_, "' (", s_.features,
                " channels): input ", x.shape.str(), " does not end in ", s_.features, " channels");
    return forward(g, s_, x);
  }

  Param<role::norm> weight() const { return s_.weight; }
  Param<role::norm> bias() const { return s_.bias; }
  Param<role::buffer> running_mean() const { return s_.running_mean; }
  Param<role::buffer> running_var() const { return s_.running_var; }

 private:
  struct Spec {
    std::int64_t features = 0;
    float eps = 1e-5f, momentum = 0.1f;
    bool affine = true;
    Collective<B>* sync = nullptr;
    Param<role::norm> weight, bias;
    Param<role::buffer> running_mean, running_var, batches;
  };

  static Var<T> forward(Graph<P, B>& g, const Spec& s, Var<T> x) {
    auto& ctx = g.context();
    auto& params = g.params();
    const std::int64_t rows = x.rows(), cols = s.features;
    const auto channels = static_cast<std::size_t>(cols);
    float* mean = g.template scratch<float>(channels + 1);  // + the row count (SyncBatchNorm)
    float* inv_std = g.template scratch<float>(channels);
    const bool training = g.training();
    // The planning pass runs on one rank alone: no collective then.
    Collective<B>* sync = g.planning() || !training ? nullptr : s.sync;
    const detail::RowCount count{static_cast<float>(rows), sync ? mean + channels : nullptr};
    if (training) {
      float* var_sum = g.template scratch<float>(channels);
      column_sums(g, rows, cols, detail::ValueAt<T>{x.data, cols}, mean);
      if (sync) {
        for_each(ctx, 1, detail::SetOp{mean + channels, static_cast<float>(rows)});
        sync->all_reduce_sum(ctx, Span<float>(mean, channels + 1));
      }
      for_each(ctx, channels, detail::MeanOp{mean, count});
      column_sums(g, rows, cols, detail::SquaredDeviationAt<T>{x.data, mean, cols}, var_sum);
      if (sync) sync->all_reduce_sum(ctx, Span<float>(var_sum, channels));
      const bool update = !g.planning();
      for_each(ctx, channels,
               detail::BatchStatsOp{mean, var_sum, inv_std, update ? params.values(s.running_mean).data : nullptr,
                                    update ? params.values(s.running_var).data : nullptr,
                                    params.values(s.batches).data, count, s.eps, s.momentum});
    } else {
      for_each(ctx, channels, detail::RunningStatsOp{params.values(s.running_mean).data,
                                                     params.values(s.running_var).data, mean, inv_std, s.eps});
    }
    const N* gamma = s.affine ? params.values(s.weight).data : nullptr;
    const N* beta = s.affine ? params.values(s.bias).data : nullptr;
    Var<T> y = g.template tensor<T>(x.shape);
    for_each(ctx, static_cast<std::size_t>(rows), detail::NormalizeOp<C, T, N, false>{x.data, y.data, mean, inv_std, gamma, beta, cols},
             static_cast<std::size_t>(cols));
    g.on_backward([=](Graph<P, B>& gb) { backward(gb, s, x, y, mean, inv_std, training, sync, count); });
    return y;
  }

  static void backward(Graph<P, B>& g, const Spec& s, Var<T> x, Var<T> y, const float* mean, const float* inv_std,
                       bool training, Collective<B>* sync, detail::RowCount count) {
    const T* dy = g.grad(y);
    if (!dy) return;
    auto& ctx = g.context();
    auto& params = g.params();
    const std::int64_t rows = x.rows(), cols = s.features;
    const GradOut<T> dx = g.grad_out(x);
    Temporaries<P, B> temp(g);
    float* sum_dy = g.template scratch<float>(static_cast<std::size_t>(2 * cols));
    float* sum_dy_xhat = sum_dy + cols;
    column_sums(g, rows, cols, detail::GradAt<T>{dy, cols}, sum_dy);
    column_sums(g, rows, cols, detail::GradXhatAt<T, false>{dy, x.data, mean, inv_std, cols}, sum_dy_xhat);
    const N* gamma = s.affine ? params.values(s.weight).data : nullptr;
    if (s.affine)  // this rank's sums: data parallel adds the parameter gradients over the ranks
      for_each(ctx, static_cast<std::size_t>(cols), detail::AffineGradOp<N>{sum_dy, sum_dy_xhat, params.backward_grads(s.weight).data,
                                                                              params.backward_grads(s.bias).data});
    if (dx) {
      if (sync) sync->all_reduce_sum(ctx, Span<float>(sum_dy, static_cast<std::size_t>(2 * cols)));
      for_each(ctx, static_cast<std::size_t>(rows), detail::BatchNormGradOp<C, T, N>{x.data, dy, dx.data, mean, inv_std, sum_dy, sum_dy_xhat,
                                                               gamma, cols, count, training, dx.accumulate},
               static_cast<std::size_t>(cols));
    }
  }

  std::string name_;
  Spec s_;
};

template <class P, class B>
using BatchNorm1d = BatchNorm<P, B>;
template <class P, class B>
using BatchNorm2d = BatchNorm<P, B>;

template <class P, class B>
class LayerNorm {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  using N = typename P::norm_param_type;
  using C = typename P::template compute_type<op::norm>;
  struct Config {
    std::int64_t features = 0;
    float eps = 1e-5f;
    bool affine = true;
  };
  static int torch_slots(const Config&) { return 1; }

  LayerNorm(Builder<P, B> b, const Config& cfg) : name_(b.prefix()) {
    AMP_REQUIRE(cfg.features > 0 && cfg.eps > 0, "LayerNorm '", name_, "': need features > 0 and eps > 0");
    s_.features = cfg.features, s_.eps = cfg.eps, s_.affine = cfg.affine;
    if (cfg.affine) {
      s_.weight = b.template param<role::norm>("weight", {cfg.features}, Init::constant(1.0f), false);
      s_.bias = b.template param<role::norm>("bias", {cfg.features}, Init::constant(0.0f), false);
    }
  }

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, "LayerNorm '", name_, "'");
    AMP_REQUIRE(x.shape.rank() >= 1 && x.cols() == s_.features, "LayerNorm '", name_, "' (", s_.features,
                " features): input ", x.shape.str(), " does not end in ", s_.features);
    return forward(g, s_, x);
  }

  Param<role::norm> weight() const { return s_.weight; }
  Param<role::norm> bias() const { return s_.bias; }

 private:
  struct Spec {
    std::int64_t features = 0;
    float eps = 1e-5f;
    bool affine = true;
    Param<role::norm> weight, bias;
  };

  static Var<T> forward(Graph<P, B>& g, const Spec& s, Var<T> x) {
    auto& ctx = g.context();
    auto& params = g.params();
    const std::int64_t rows = x.rows(), cols = s.features;
    float* mean = g.template scratch<float>(static_cast<std::size_t>(rows));
    float* inv_std = g.template scratch<float>(static_cast<std::size_t>(rows));
    for_each(ctx, static_cast<std::size_t>(rows), detail::RowStatsOp<T>{x.data, mean, inv_std, cols, s.eps},
             static_cast<std::size_t>(cols));
    const N* gamma = s.affine ? params.values(s.weight).data : nullptr;
    const N* beta = s.affine ? params.values(s.bias).data : nullptr;
    Var<T> y = g.template tensor<T>(x.shape);
    for_each(ctx, static_cast<std::size_t>(rows), detail::NormalizeOp<C, T, N, true>{x.data, y.data, mean, inv_std, gamma, beta, cols},
             static_cast<std::size_t>(cols));
    g.on_backward([=](Graph<P, B>& gb) { backward(gb, s, x, y, mean, inv_std); });
    return y;
  }

  static void backward(Graph<P, B>& g, const Spec& s, Var<T> x, Var<T> y, const float* mean, const float* inv_std) {
    const T* dy = g.grad(y);
    if (!dy) return;
    auto& ctx = g.context();
    auto& params = g.params();
    const std::int64_t rows = x.rows(), cols = s.features;
    const GradOut<T> dx = g.grad_out(x);
    Temporaries<P, B> temp(g);
    const N* gamma = s.affine ? params.values(s.weight).data : nullptr;
    if (s.affine) {
      float* sum_dy = g.template scratch<float>(static_cast<std::size_t>(cols));
      float* sum_dy_xhat = g.template scratch<float>(static_cast<std::size_t>(cols));
      column_sums(g, rows, cols, detail::GradAt<T>{dy, cols}, sum_dy);
      column_sums(g, rows, cols, detail::GradXhatAt<T, true>{dy, x.data, mean, inv_std, cols}, sum_dy_xhat);
      for_each(ctx, static_cast<std::size_t>(cols), detail::AffineGradOp<N>{sum_dy, sum_dy_xhat, params.backward_grads(s.weight).data,
                                                                              params.backward_grads(s.bias).data});
    }
    if (dx)
      for_each(ctx, static_cast<std::size_t>(rows),
               detail::LayerNormGradOp<C, T, N>{x.data, dy, dx.data, mean, inv_std, gamma, cols, dx.accumulate},
               static_cast<std::size_t>(cols));
  }

  std::string name_;
  Spec s_;
};

}  // namespace amp::nn
