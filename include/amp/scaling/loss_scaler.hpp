#pragma once
// Loss scalers. State (scale, counters, the latest gradient statistics) lives in
// backend memory and is updated there, so a training step never waits for the
// host. The host watches a lagging mirror of it to stop a diverged run.
#include <cmath>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/backend/host/mirror.hpp"
#include "amp/policy.hpp"
#include "amp/scaling/grad_stats.hpp"

namespace amp {

struct ScalerConfig {
  scaling mode = scaling::dynamic;
  float init_scale = 65536.0f;      // 2^16, as Apex and PyTorch
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;       // clean steps before the scale grows
  float max_scale = 16777216.0f;    // 2^24
  float min_scale = 1.0f;           // the floor: backoff never goes below it
  // This many skipped steps in a row is a divergence (NaN loss, or overflow at
  // the floor), reported as an error instead of skipping forever.
  int max_consecutive_skips = 32;
};

// The config a policy implies: dynamic for fp16 mixed precision, a static 1.0
// for O3, none (scale 1) for O0 and the bf16 levels. Every mode still skips a
// step whose gradients are not finite.
template <Policy P>
constexpr ScalerConfig default_scaler_config() {
  ScalerConfig cfg;
  cfg.mode = P::loss_scaling;
  if (P::loss_scaling != scaling::dynamic) cfg.init_scale = 1.0f;
  return cfg;
}

struct ScalerState {
  float scale = 1.0f;
  int growth_tracker = 0;
  int consecutive_skips = 0;
  int unscaled = 0;  // gradients already divided by the scale this step
  GradStats stats;
  long long steps = 0;
  long long skipped = 0;
};

struct ScalerStats {
  long long steps = 0;
  long long skipped = 0;
  float scale = 0.0f;
  float last_max_abs_grad = 0.0f;  // unscaled
  float last_grad_norm = 0.0f;     // unscaled global L2 norm
  int consecutive_skips = 0;
};

namespace detail {
struct UpdateScaleOp {
  ScalerState* s;
  ScalerConfig cfg;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    ++s->steps;
    s->unscaled = 0;
    if (overflowed(s->stats)) {
      ++s->skipped;
      ++s->consecutive_skips;
      s->growth_tracker = 0;
      if (cfg.mode == scaling::dynamic) {
        const float next = s->scale * cfg.backoff_factor;
        s->scale = next < cfg.min_scale ? cfg.min_scale : next;
      }
      return;
    }
    s->consecutive_skips = 0;
    if (cfg.mode == scaling::dynamic && ++s->growth_tracker >= cfg.growth_interval) {
      s->growth_tracker = 0;
      const float next = s->scale * cfg.growth_factor;
      s->scale = !is_finite(next) || next > cfg.max_scale ? cfg.max_scale : next;
    }
  }
};

template <class G>
struct UnscaleOp {
  G* g;
  const ScalerState* s;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { g[i] = cast<G>(cast<float>(g[i]) / s->scale); }
};

struct MarkUnscaledOp {
  ScalerState* s;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    s->stats.sumsq /= s->scale * s->scale;
    s->stats.maxabs /= s->scale;
    s->unscaled = 1;
  }
};
}  // namespace detail

template <class Loss, class Scaler, class Optimizer>
class ScaledLoss;

template <Backend B>
class LossScaler {
 public:
  using backend = B;
  LossScaler(Context<B>& ctx, ScalerConfig cfg) : ctx_(&ctx), cfg_(cfg), state_(ctx, 1, memory_kind::optimizer), mirror_(ctx) {
    AMP_REQUIRE(cfg.init_scale > 0 && std::isfinite(cfg.init_scale) && cfg.min_scale > 0 &&
                    cfg.max_scale >= cfg.min_scale && cfg.init_scale >= cfg.min_scale &&
                    cfg.init_scale <= cfg.max_scale,
                "LossScaler: need 0 < min_scale <= init_scale <= max_scale (finite), got min ", cfg.min_scale,
                ", init ", cfg.init_scale, ", max ", cfg.max_scale);
    AMP_REQUIRE(cfg.growth_factor > 1 && cfg.backoff_factor > 0 && cfg.backoff_factor < 1 &&
                    cfg.growth_interval > 0 && cfg.max_consecutive_skips > 0,
                "LossScaler: need growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0 and "
                "max_consecutive_skips > 0");
    ScalerState init;
    init.scale = cfg.init_scale;
    upload(ctx, state_.span(), &init, 1);
  }

  const ScalerConfig& config() const { return cfg_; }
  Context<B>& context() const { return *ctx_; }
  // Backend pointers read by the loss seed and the optimizer kernels.
  const float* scale_ptr() const { return &state_.data()->scale; }
  const ScalerState* state() const { return state_.data(); }

  // scaler.scale(loss): the explicit (PyTorch GradScaler) form; see amp/train.hpp.
  template <class Loss>
  auto scale(Loss& loss);

  // The overflow check over the flat gradient arena: one reduction, no sync.
  template <class G>
  void check(Span<const G> grads) {
    grad_stats(*ctx_, grads, &state_.data()->stats);
    checked_ = true;
  }

  // Divides the gradients by the scale in place (for users who clip or inspect
  // them by hand); the optimizer then skips its own fused unscale.
  template <class Optimizer>
  void unscale(Optimizer& opt) {
    auto grads = opt.parameters().grads();
    if (!checked_) check(Span<const typename decltype(grads)::value_type>(grads));
    for_each(*ctx_, grads.size, detail::UnscaleOp<typename decltype(grads)::value_type>{grads.data, state()});
    for_each(*ctx_, 1, detail::MarkUnscaledOp{state_.data()});
  }

  // Runs the optimizer's fused step, which skips itself on device on overflow.
  template <class Optimizer>
  void step(Optimizer& opt) {
    if (!checked_) check(Span<const typename Optimizer::grad_type>(opt.parameters().grads()));
    opt.apply(state());
  }

  // Backoff or growth, on device; then the host looks at the newest landed
  // state and reports a divergence.
  void update() {
    for_each(*ctx_, 1, detail::UpdateScaleOp{state_.data(), cfg_});
    checked_ = false;
    mirror_.refresh(*ctx_, state());
    if (const ScalerState* seen = mirror_.latest(); seen && seen->consecutive_skips >= cfg_.max_consecutive_skips)
      fail("amp: training diverged: ", seen->consecutive_skips,
           " consecutive steps had non-finite gradients (loss scale ", seen->scale,
           cfg_.mode == scaling::dynamic && seen->scale <= cfg_.min_scale ? ", at its floor" : "",
           "); the parameters are those of the last good step. Check the loss and the data for NaN/inf, "
           "or lower the learning rate.");
  }

  // One sync: counters, scale and the latest gradient statistics.
  ScalerStats stats() const {
    const ScalerState s = download_one(*ctx_, state());
    const float unscale = s.unscaled ? 1.0f : 1.0f / s.scale;
    return {s.steps, s.skipped, s.scale, s.stats.maxabs * unscale, std::sqrt(s.stats.sumsq) * unscale,
            s.consecutive_skips};
  }

 private:
  Context<B>* ctx_;
  ScalerConfig cfg_;
  Buffer<ScalerState, B> state_;
  Mirror<ScalerState, B> mirror_;
  bool checked_ = false;
};

template <Backend B>
struct DynamicLossScaler : LossScaler<B> {
  explicit DynamicLossScaler(Context<B>& ctx, ScalerConfig cfg = {}) : LossScaler<B>(ctx, with_mode(cfg)) {}

 private:
  static ScalerConfig with_mode(ScalerConfig cfg) {
    cfg.mode = scaling::dynamic;
    return cfg;
  }
};

template <Backend B>
struct StaticLossScaler : LossScaler<B> {
  explicit StaticLossScaler(Context<B>& ctx, float scale = 1.0f) : LossScaler<B>(ctx, config(scale)) {}

 private:
  static ScalerConfig config(float scale) {
    ScalerConfig cfg;
    cfg.mode = scaling::static_scale;
    cfg.init_scale = cfg.min_scale = cfg.max_scale = scale;
    return cfg;
  }
};

template <Backend B>
struct NoLossScaler : LossScaler<B> {
  explicit NoLossScaler(Context<B>& ctx) : LossScaler<B>(ctx, config()) {}

 private:
  static ScalerConfig config() {
    ScalerConfig cfg;
    cfg.mode = scaling::none;
    cfg.init_scale = cfg.min_scale = cfg.max_scale = 1.0f;
    return cfg;
  }
};

}  // namespace amp
