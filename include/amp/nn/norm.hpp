#pragma once
// Normalisation layers, one family: Norm<P, B, Axis> with the statistics' axis
// a compile-time choice. Their scale and shift have the norm role (stored as
// norm_param_type: fp32 under O2, as Apex keeps BatchNorm); the math is in
// nn/norm_ops.hpp.
//   BatchNorm (statistics::per_column): per channel (the last dimension) over
//   every other position, so one class serves [N, C] (BatchNorm1d) and
//   channels-last [N, H, W, C] (BatchNorm2d); fp32 running mean and variance
//   (buffers) for evaluation, updated with momentum by each training forward.
//   Each forward normalises with its own batch's statistics, so two forwards
//   of one iteration (a GAN's real and fake batch) never mix them.
//   With Config::sync (SyncBatchNorm), the sums behind the statistics and the
//   backward's sums are added over every rank, so a per-rank batch of B
//   normalises as one batch of B x ranks (parameter gradients stay per rank:
//   data parallel sums them).
//   LayerNorm (statistics::per_row): per row over the last dimension.
//   RMSNorm (statistics::per_row_rms, as Apex's FusedRMSNorm and Llama): per
//   row, x / sqrt(mean(x^2) + eps) * weight: no centring, no bias.
#include <string>
#include <type_traits>

#include "amp/backend/collective.hpp"
#include "amp/model/model.hpp"
#include "amp/model/numerics_sites.hpp"
#include "amp/nn/norm_ops.hpp"

namespace amp::nn {

enum class statistics { per_column, per_row, per_row_rms };

template <Backend B>
struct BatchNormConfig {
  std::int64_t features = 0;  // channels
  float eps = 1e-5f;
  float momentum = 0.1f;
  bool affine = true;
  Collective<B>* sync = nullptr;  // SyncBatchNorm: statistics over the batches of every rank
};
struct LayerNormConfig {
  std::int64_t features = 0;
  float eps = 1e-5f;
  bool affine = true;
};
using RMSNormConfig = LayerNormConfig;  // Apex's FusedRMSNorm(normalized_shape, eps = 1e-5, elementwise_affine)

template <class P, class B, statistics Axis>
class Norm {
  static_assert(Policy<P> && Backend<B>);
  static constexpr bool batch = Axis == statistics::per_column;
  static constexpr bool centered = Axis != statistics::per_row_rms;
  static constexpr const char* kind = batch ? "BatchNorm" : centered ? "LayerNorm" : "RMSNorm";

 public:
  using T = typename P::activation_type;
  using N = typename P::norm_param_type;
  using C = typename P::template compute_type<op::norm>;
  using Config = std::conditional_t<batch, BatchNormConfig<B>, LayerNormConfig>;
  static int torch_slots(const Config&) { return 1; }

  Norm(Builder<P, B> b, const Config& cfg) : name_(b.prefix()) {
    AMP_REQUIRE(cfg.features > 0 && cfg.eps > 0, kind, " '", name_, "': need features > 0 and eps > 0");
    s_.features = cfg.features, s_.eps = cfg.eps, s_.affine = cfg.affine;
    if (cfg.affine) {
      s_.weight = b.template param<role::norm>("weight", {cfg.features}, Init::constant(1.0f), false);
      if (centered) s_.bias = b.template param<role::norm>("bias", {cfg.features}, Init::constant(0.0f), false);
    }
    if constexpr (batch) {
      AMP_REQUIRE(cfg.momentum >= 0 && cfg.momentum <= 1, kind, " '", name_, "': need momentum in [0, 1]");
      s_.momentum = cfg.momentum, s_.sync = cfg.sync;
      s_.running_mean = b.template param<role::buffer>("running_mean", {cfg.features}, Init::constant(0.0f), false);
      s_.running_var = b.template param<role::buffer>("running_var", {cfg.features}, Init::constant(1.0f), false);
      s_.batches = b.template param<role::buffer>("num_batches_tracked", Shape{}, Init::constant(0.0f), false);
    }
  }

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, kind, " '", name_, "'");
    AMP_REQUIRE(x.shape.rank() >= (batch ? 2 : 1) && x.cols() == s_.features, kind, " '", name_, "' (", s_.features,
                batch ? " channels" : " features", "): input ", x.shape.str(), " does not end in ", s_.features,
                batch ? " channels" : "");
    Var<T> y = forward(g, s_, x);
    observe_layer(g, y, name_, kind);
    return y;
  }

  Param<role::norm> weight() const { return s_.weight; }
  Param<role::norm> bias() const requires centered { return s_.bias; }
  Param<role::buffer> running_mean() const requires batch { return s_.running_mean; }
  Param<role::buffer> running_var() const requires batch { return s_.running_var; }

 private:
  struct Spec {
    std::int64_t features = 0;
    float eps = 1e-5f, momentum = 0.1f;
    bool affine = true;
    Collective<B>* sync = nullptr;
    Param<role::norm> weight, bias;
    Param<role::buffer> running_mean, running_var, batches;
  };
  // What a forward keeps for its backward: its own statistics.
  struct Saved {
    const float* mean;
    const float* inv_std;
    bool training;
    Collective<B>* sync;
    detail::RowCount count;
  };

  static Var<T> forward(Graph<P, B>& g, const Spec& s, Var<T> x) {
    auto& params = g.params();
    const std::int64_t rows = x.rows(), cols = s.features;
    const N* gamma = s.affine ? params.values(s.weight).data : nullptr;
    const N* beta = s.affine && centered ? params.values(s.bias).data : nullptr;
    Var<T> y = g.template tensor<T>(x.shape);
    Saved saved;
    if constexpr (batch) {
      saved = batch_statistics(g, s, x);
      for_each_row(g.context(), static_cast<std::size_t>(rows), cols,
                   detail::NormalizeColumnsOp<C, T, N>{x.data, y.data, saved.mean, saved.inv_std, gamma, beta, cols});
    } else {  // statistics and the normalised row in one pass
      float* mean = centered ? g.template scratch<float>(static_cast<std::size_t>(rows)) : nullptr;
      float* inv_std = g.template scratch<float>(static_cast<std::size_t>(rows));
      for_each_row(g.context(), static_cast<std::size_t>(rows), cols,
                   detail::LayerNormForwardOp<C, T, N, centered>{x.data, y.data, mean, inv_std, gamma, beta, cols, s.eps});
      saved = {mean, inv_std, true, nullptr, {static_cast<float>(rows), nullptr}};
    }
    g.on_backward([=](Graph<P, B>& gb) { backward(gb, s, x, y, saved); });
    return y;
  }

  // Per channel: this batch's (training) or the running statistics.
  static Saved batch_statistics(Graph<P, B>& g, const Spec& s, Var<T> x) {
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
    if (!training) {
      for_each(ctx, channels, detail::RunningStatsOp{params.values(s.running_mean).data,
                                                     params.values(s.running_var).data, mean, inv_std, s.eps});
      return {mean, inv_std, training, sync, count};
    }
    float* var_sum = g.template scratch<float>(channels);
    column_sums(g, rows, cols, detail::ValueAt<T>{x.data, cols}, mean);
    if (sync) {
      for_each(ctx, 1, detail::SetOp{mean + channels, static_cast<float>(rows)});
      sync->all_reduce_sum(ctx, Span<float>(mean, channels + 1));
    }
    for_each(ctx, channels, detail::MeanOp{mean, count});
    column_sums(g, rows, cols, detail::SquaredDeviationAt<T>{x.data, mean, cols}, var_sum);
    if (sync) sync->all_reduce_sum(ctx, Span<float>(var_sum, channels));
    const bool update = !g.planning() && !g.replaying();  // a checkpoint's replay updates nothing twice
    for_each(ctx, channels,
             detail::BatchStatsOp{mean, var_sum, inv_std, update ? params.values(s.running_mean).data : nullptr,
                                  update ? params.values(s.running_var).data : nullptr, params.values(s.batches).data,
                                  count, s.eps, s.momentum});
    return {mean, inv_std, training, sync, count};
  }

  static void backward(Graph<P, B>& g, const Spec& s, Var<T> x, Var<T> y, const Saved& saved) {
    const T* dy = g.grad(y);
    if (!dy) return;
    auto& ctx = g.context();
    auto& params = g.params();
    const std::int64_t rows = x.rows(), cols = s.features;
    const auto width = static_cast<std::size_t>(cols);
    const GradOut<T> dx = g.grad_out(x);
    Temporaries<P, B> temp(g);
    const N* gamma = s.affine ? params.values(s.weight).data : nullptr;
    // sum dy and sum dy xhat per column: the affine gradients, and BatchNorm's input gradient.
    float* sum_dy = nullptr;
    float* sum_dy_xhat = nullptr;
    if (s.affine || batch) {
      sum_dy = g.template scratch<float>(2 * width);
      sum_dy_xhat = sum_dy + cols;
      if (centered) column_sums(g, rows, cols, detail::ValueAt<T>{dy, cols}, sum_dy);
      column_sums(g, rows, cols, detail::GradXhatAt<T, !batch, centered>{dy, x.data, saved.mean, saved.inv_std, cols},
                  sum_dy_xhat);
    }
    if (s.affine)  // this rank's sums: data parallel adds the parameter gradients over the ranks
      for_each(ctx, width, detail::AffineGradOp<N>{sum_dy, sum_dy_xhat, params.backward_grads(s.weight).data,
                                                   centered ? params.backward_grads(s.bias).data : nullptr});
    if (!dx) return;
    if constexpr (batch) {
      if (saved.sync) saved.sync->all_reduce_sum(ctx, Span<float>(sum_dy, 2 * width));
      for_each_row(ctx, static_cast<std::size_t>(rows), cols,
                   detail::BatchNormGradOp<C, T, N>{x.data, dy, dx.data, saved.mean, saved.inv_std, sum_dy, sum_dy_xhat,
                                                    gamma, cols, saved.count, saved.training, dx.accumulate});
    } else {
      for_each_row(ctx, static_cast<std::size_t>(rows), cols,
                   detail::LayerNormGradOp<C, T, N, centered>{x.data, dy, dx.data, saved.mean, saved.inv_std, gamma,
                                                              cols, dx.accumulate});
    }
  }

  std::string name_;
  Spec s_;
};

template <class P, class B>
using BatchNorm = Norm<P, B, statistics::per_column>;
template <class P, class B>
using BatchNorm1d = BatchNorm<P, B>;
template <class P, class B>
using BatchNorm2d = BatchNorm<P, B>;
template <class P, class B>
using LayerNorm = Norm<P, B, statistics::per_row>;
template <class P, class B>
using RMSNorm = Norm<P, B, statistics::per_row_rms>;

}  // namespace amp::nn
