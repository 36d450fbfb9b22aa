#pragma once
// Loss scalers, PyTorch's GradScaler and Apex's dynamic scaler in one. The mode
// (none, static, dynamic) is a compile-time parameter: where a policy has no
// loss scaling, nothing is multiplied or divided at all; the non-finite check
// stays, so no level trains on NaN.
//
// A scaler decides what its scale means for one optimizer's gradients of the
// iteration (scaling/gradients.hpp): unscale(opt) checks them (one
// device-side reduction, no host sync) and moves them, unscaled, into fp32,
// where they can be read and edited; step(opt) checks them unless unscale()
// did and hands the optimizer's update the record of that check (the update
// is skipped on the device if that optimizer's gradients overflowed: the
// verdict is per optimizer, as in PyTorch); update() backs the scale off if
// any optimizer it checked overflowed, or grows it. Calls out of order are
// errors: unscale() or step() twice for one optimizer, update() without a
// step or unscale, a scaled backward after this iteration's step or unscale.
//
// Scale, counters and the verdict live in backend memory and are updated
// there; the host watches a lagging mirror of them to stop a diverged run
// (after each replay when the step is a captured graph). set_config() in a
// captured step takes effect at the next capture: the graph holds the config.
#include <algorithm>
#include <cmath>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/backend/host/mirror.hpp"
#include "amp/scaling/grad_stats.hpp"
#include "amp/scaling/step_record.hpp"
#include "amp/policy.hpp"

namespace amp {

struct ScalerConfig {
  float init_scale = 65536.0f;    // 2^16, as Apex and PyTorch
  float growth_factor = 2.0f;     // 1: the scale never grows (Apex accepts it)
  float backoff_factor = 0.5f;
  int growth_interval = 2000;     // clean steps before the scale grows
  float max_scale = 16777216.0f;  // 2^24
  float min_scale = 1.0f;         // the floor: backoff never goes below it
  // Hysteresis h: after each refill of the tracker (to h), h-1 overflows only
  // skip their step; every further one backs the scale off as well. 1 is
  // PyTorch's GradScaler: every overflow backs off.
  int hysteresis = 1;
  // When the tracker is refilled. true: at every clean step (Apex's
  // csrc/update_scale_hysteresis.cu; DeepSpeed's consecutive_hysteresis=True).
  // false: only when the scale grows (Megatron's DynamicGradScaler; DeepSpeed's default).
  bool consecutive_hysteresis = true;
  // This many skipped steps in a row is a divergence (NaN loss, or overflow at
  // the floor), reported as an error instead of skipping forever.
  int max_consecutive_skips = 32;
};

// A scaler's state, all of it: what a checkpoint saves and restores.
struct ScalerState {
  float scale = 1.0f;
  int growth_tracker = 0;     // clean steps since the last change
  int hysteresis_left = 1;    // the hysteresis tracker; at 0 every overflow backs off
  int consecutive_skips = 0;
  int found_inf = 0;          // this iteration's verdict
  long long steps = 0;
  long long skipped = 0;
};

struct ScalerStats {
  long long steps = 0;
  long long skipped = 0;
  float scale = 0.0f;
  int consecutive_skips = 0;
};

namespace detail {
template <scaling Mode>
struct UpdateScaleOp {
  ScalerState* s;
  ScalerConfig cfg;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    ++s->steps;
    if (s->found_inf) {
      ++s->skipped;
      ++s->consecutive_skips;
      s->growth_tracker = 0;
      if constexpr (Mode == scaling::dynamic) {
        // Apex and Megatron count on below 0; stopping at 0 makes the same decisions.
        if (s->hysteresis_left > 0) --s->hysteresis_left;
        if (s->hysteresis_left <= 0) {
          const float next = s->scale * cfg.backoff_factor;
          s->scale = next < cfg.min_scale ? cfg.min_scale : next;
        }
      }
    } else {
      s->consecutive_skips = 0;
      if constexpr (Mode == scaling::dynamic) {
        if (cfg.consecutive_hysteresis) s->hysteresis_left = cfg.hysteresis;
        if (++s->growth_tracker >= cfg.growth_interval) {
          s->growth_tracker = 0;
          s->hysteresis_left = cfg.hysteresis;  // both rules refill at growth
          const float next = s->scale * cfg.growth_factor;
          if (is_finite(next)) s->scale = next > cfg.max_scale ? cfg.max_scale : next;  // else keep it, as PyTorch
        }
      }
    }
    s->found_inf = 0;
  }
};

struct SetScaleOp {
  ScalerState* s;
  float scale;
  AMP_HOST_DEVICE void operator()(std::size_t) const { s->scale = scale; }
};
}  // namespace detail

template <class Loss, class Scaler>
class ScaledLoss;

template <Backend B, scaling Mode>
class LossScaler {
 public:
  using backend = B;
  static constexpr scaling mode = Mode;

  explicit LossScaler(Context<B>& ctx, ScalerConfig cfg = {}) : ctx_(&ctx), cfg_(valid(cfg)), state_(ctx, 1, memory_kind::optimizer), mirror_(ctx) {
    ScalerState init;
    init.scale = Mode == scaling::none ? 1.0f : cfg_.init_scale;
    init.hysteresis_left = cfg_.hysteresis;
    upload(ctx, state_.span(), &init, 1);
  }
  LossScaler(const LossScaler&) = delete;
  LossScaler& operator=(const LossScaler&) = delete;

  const ScalerConfig& config() const { return cfg_; }
  // New settings from the next update() on (the scale itself: update(new_scale)).
  void set_config(const ScalerConfig& cfg) { cfg_ = valid(cfg); }
  Context<B>& context() const { return *ctx_; }
  // The scale as the loss seeds read it (nullptr: no scaling, nothing to multiply).
  const float* scale_ptr() const {
    if constexpr (Mode == scaling::none) return nullptr;
    else return &state_.data()->scale;
  }

  // scaler.scale(loss): the explicit (PyTorch GradScaler) form; see ScaledLoss.
  template <class Loss>
  ScaledLoss<Loss, LossScaler> scale(Loss& loss) {
    return ScaledLoss<Loss, LossScaler>(loss, *this);
  }

  // Its scale can differ from 1: a backward of the loss as it is would then
  // be divided by it (a static 1.0, O3's default, multiplies nothing).
  bool multiplies() const {
    return Mode == scaling::dynamic || (Mode == scaling::static_scale && cfg_.init_scale != 1.0f);
  }
  // Whether a backward of this iteration was scaled by this scaler (until update()).
  bool scaled_this_iteration() const { return scaled_; }

  // Checks this optimizer's gradients and divides them by the scale into
  // fp32 (opt.gradients().unscaled(...) reads and edits them until the step).
  // Several scalers may unscale into one optimizer (Apex's num_losses): their
  // shares add.
  template <class Optimizer>
  void unscale(Optimizer& opt) {
    unscale_gradients(opt.gradients());
  }
  template <class Gradients>
  void unscale_gradients(Gradients& grads) {
    const Record r = find(&grads);
    AMP_REQUIRE(!r.unscaled, "loss scaler: unscale() was already called for this optimizer since the last update()");
    AMP_REQUIRE(!r.stepped, "loss scaler: unscale() after this optimizer's step()");
    unscale_share(grads);
  }

  // Applies the optimizer's step now, as PyTorch's scaler.step(opt): its
  // update consumes this scaler's record of its gradients.
  template <class Optimizer>
  void step(Optimizer& opt) {
    detail::StepAccess::update(opt, for_step(opt.gradients()));
  }
  // The record one optimizer's update consumes: its gradients checked first
  // unless unscale() did. Once per optimizer and iteration.
  template <class Gradients>
  StepRecord for_step(Gradients& grads) {
    const Record r = find(&grads);
    AMP_REQUIRE(!r.stepped, "loss scaler: step() was already called for this optimizer since the last update()");
    if (!r.unscaled) {
      if (grads.unscaled()) unscale_share(grads);  // another scaler's share is in fp32: this one joins it
      else grads.check(&state_.data()->found_inf, multiplies());
    }
    keep(&grads).stepped = true;
    return grads.record(scale_ptr());
  }

  // Ends the iteration: backs the scale off if any gradient this scaler
  // checked overflowed, or grows it, on the device; then looks at the newest
  // landed state and reports a divergence.
  void update() {
    AMP_REQUIRE(!records_.empty(), "loss scaler: update() without a step() or unscale() since the last update()");
    for_each(*ctx_, 1, detail::UpdateScaleOp<Mode>{state_.data(), cfg_});
    records_.clear();
    scaled_ = false;
    ctx_->after_step_on_host([this] { watch_divergence(); });  // the mirror's copy is host work
  }
  // Sets the scale (PyTorch's update(new_scale)), after ending the iteration if one is open.
  void update(float new_scale) {
    AMP_REQUIRE(new_scale > 0 && std::isfinite(new_scale), "loss scaler: update(", new_scale,
                "): the scale must be positive and finite");
    static_assert(Mode != scaling::none, "update(new_scale): this scaler does not scale");
    if (!records_.empty()) update();
    for_each(*ctx_, 1, detail::SetScaleOp{state_.data(), new_scale});
  }

  // One sync: counters and scale.
  ScalerStats stats() const {
    const ScalerState s = state();
    return {s.steps, s.skipped, s.scale, s.consecutive_skips};
  }
  ScalerState state() const { return download_one(*ctx_, static_cast<const ScalerState*>(state_.data())); }
  void set_state(const ScalerState& s) {
    AMP_REQUIRE(records_.empty(), "loss scaler: set_state() in the middle of an iteration");
    upload(*ctx_, state_.span(), &s, 1);
  }
  const ScalerState* state_ptr() const { return state_.data(); }

 private:
  static ScalerConfig valid(ScalerConfig cfg) {
    if constexpr (Mode == scaling::static_scale) cfg.min_scale = cfg.max_scale = cfg.init_scale;
    AMP_REQUIRE(cfg.init_scale > 0 && std::isfinite(cfg.init_scale) && cfg.min_scale > 0 &&
                    cfg.max_scale >= cfg.min_scale && cfg.init_scale >= cfg.min_scale && cfg.init_scale <= cfg.max_scale,
                "LossScaler: need 0 < min_scale <= init_scale <= max_scale (finite), got min ", cfg.min_scale, ", init ",
                cfg.init_scale, ", max ", cfg.max_scale);
    AMP_REQUIRE(cfg.growth_factor >= 1 && cfg.backoff_factor > 0 && cfg.backoff_factor < 1 && cfg.growth_interval > 0 &&
                    cfg.hysteresis >= 1 && cfg.max_consecutive_skips > 0,
                "LossScaler: need growth_factor >= 1, 0 < backoff_factor < 1, growth_interval > 0, hysteresis >= 1 and "
                "max_consecutive_skips > 0");
    return cfg;
  }

  // A scaled backward is about to run: only before this iteration's steps.
  template <class, class>
  friend class ScaledLoss;
  void before_backward() {
    AMP_REQUIRE(records_.empty(), "loss scaler: a scaled backward after this iteration's step() or unscale(); call "
                                  "update() first (every backward of an iteration comes before its first step)");
    scaled_ = true;
  }

  // What this scaler did to one optimizer's gradients in this iteration.
  struct Record {
    const void* gradients;
    bool unscaled = false, stepped = false;
  };
  // This iteration's record of one optimizer's gradients (a blank one if none yet).
  Record find(const void* grads) const {
    for (const auto& r : records_)
      if (r.gradients == grads) return r;
    return Record{grads};
  }
  Record& keep(const void* grads) {
    for (auto& r : records_)
      if (r.gradients == grads) return r;
    return records_.emplace_back(Record{grads});
  }
  // Checks (a throw changes nothing) and unscales one optimizer's gradients.
  template <class Gradients>
  void unscale_share(Gradients& grads) {
    grads.check(&state_.data()->found_inf, multiplies());
    grads.unscale(scale_ptr());
    keep(&grads).unscaled = true;
  }

  void watch_divergence() {
    mirror_.refresh(*ctx_, state_.data());
    if (const ScalerState* seen = mirror_.latest(); seen && seen->consecutive_skips >= cfg_.max_consecutive_skips)
      fail("amp: training diverged: ", seen->consecutive_skips,
           " consecutive steps had non-finite gradients (loss scale ", seen->scale,
           Mode == scaling::dynamic && seen->scale <= cfg_.min_scale ? ", at its floor" : "",
           "); the parameters are those of the last good step. Check the loss and the data for NaN/inf, "
           "or lower the learning rate.");
  }

  Context<B>* ctx_;
  ScalerConfig cfg_;
  Buffer<ScalerState, B> state_;
  Mirror<ScalerState, B> mirror_;
  std::vector<Record> records_;  // this iteration's optimizers
  bool scaled_ = false;          // a backward of this iteration carried this scale
};

template <Backend B>
using DynamicLossScaler = LossScaler<B, scaling::dynamic>;
template <Backend B>
using StaticLossScaler = LossScaler<B, scaling::static_scale>;
template <Backend B>
using NoLossScaler = LossScaler<B, scaling::none>;

// The scaler a policy implies: dynamic for fp16 mixed precision, a static 1.0
// for O3, none for O0 and the bf16 levels.
template <Policy P, Backend B>
using default_scaler_t = LossScaler<B, P::loss_scaling>;

template <Policy P>
constexpr ScalerConfig default_scaler_config() {
  ScalerConfig cfg;
  if (P::loss_scaling != scaling::dynamic) cfg.init_scale = 1.0f;
  return cfg;
}

// What scale_loss / scaler.scale return: backward() back-propagates loss x scale.
template <class Loss, class Scaler>
class ScaledLoss {
 public:
  ScaledLoss(Loss& loss, Scaler& scaler) : loss_(&loss), scaler_(&scaler) {}
  ScaledLoss(const ScaledLoss&) = delete;
  ScaledLoss& operator=(const ScaledLoss&) = delete;

  // Gradients accumulate (scaled) until the step, which checks and unscales them.
  void backward() {
    scaler_->before_backward();
    loss_->backward(scaler_->scale_ptr());
  }

 private:
  Loss* loss_;
  Scaler* scaler_;
};

}  // namespace amp
