#pragma once
// The fused optimizer step: one pass over the flat parameter arena that, per
// element, unscales (and clips) the gradient, updates the fp32 value (the
// master copy where the policy has one) and writes the stored weight. It reads
// the overflow flag on the device and returns without touching anything, so a
// skipped step needs no host sync and leaves every bit as it was.
#include <cmath>
#include <cstdint>
#include <functional>

#include "amp/nn/parameters.hpp"
#include "amp/scaling/loss_scaler.hpp"

namespace amp::optim {

// Step count and bias-correction products, advanced on device by good steps
// only, and this step's gradient coefficient, computed once before the pass.
struct OptimizerState {
  std::int64_t t = 0;
  float beta1_pow = 1.0f;
  float beta2_pow = 1.0f;
  int skip = 0;        // this step overflowed: the pass returns at once
  float coef = 1.0f;   // unscale x clip x 1/accumulation
};

struct CommonOptions {
  float max_grad_norm = 0.0f;        // > 0: clip by global L2 norm (of the unscaled gradients)
  int accumulation_steps = 1;        // micro-batches summed before each step
};

namespace detail {
// One thread, before the pass: skip flag and gradient coefficient from the scaler's check.
struct PrepareStepOp {
  OptimizerState* state;
  const ScalerState* scaler;
  float max_norm;
  float inv_accumulation;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    state->skip = overflowed(scaler->stats) ? 1 : 0;
    const float unscale = (scaler->unscaled ? 1.0f : 1.0f / scaler->scale) * inv_accumulation;
    float coef = unscale;
    if (max_norm > 0.0f) {
      const float norm = sqrtf(scaler->stats.sumsq) * unscale;
      if (norm > max_norm) coef *= max_norm / (norm + 1e-6f);
    }
    state->coef = coef;
  }
};

// Master weights and state buffers are known per policy and rule at compile
// time, so the per-element body has no pointer tests.
template <class Param, class Grad, class Rule, bool Master>
struct FusedStepOp {
  Param* w;
  float* master;  // unused without master weights: the fp32 weights hold the value
  const Grad* g;
  float* s1;
  float* s2;
  const OptimizerState* state;
  Rule rule;
  float lr;

  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    if (state->skip) return;
    const float grad = cast<float>(g[i]) * state->coef;
    float x = Master ? master[i] : cast<float>(w[i]);
    float* m1 = Rule::state_buffers > 0 ? s1 + i : nullptr;
    float* m2 = Rule::state_buffers > 1 ? s2 + i : nullptr;
    x = rule.update(x, grad, m1, m2, *state, lr);
    if constexpr (Master) master[i] = x;
    w[i] = cast<Param>(x);
  }
};

template <class Rule>
struct AdvanceStateOp {
  OptimizerState* state;
  Rule rule;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    if (state->skip) return;
    ++state->t;
    state->beta1_pow *= rule.beta1_or_one();
    state->beta2_pow *= rule.beta2_or_one();
  }
};
}  // namespace detail

// Shared by SGD, Adam and AdamW; Rule holds the per-element update.
template <Policy P, Backend B, class Rule>
class FusedOptimizer {
 public:
  using policy = P;
  using param_type = typename P::param_type;
  using grad_type = typename P::grad_type;

  FusedOptimizer(nn::Parameters<P, B>& params, Rule rule, float lr, CommonOptions common, ScalerConfig scaler)
      : params_(&params),
        rule_(rule),
        lr_(lr),
        common_(common),
        scaler_(params.context(), scaler),
        state_(params.context(), 1, memory_kind::optimizer) {
    AMP_REQUIRE(lr >= 0 && std::isfinite(lr), "optimizer: learning rate must be finite and >= 0, got ", lr);
    AMP_REQUIRE(common.accumulation_steps >= 1, "optimizer: accumulation_steps must be >= 1, got ",
                common.accumulation_steps);
    AMP_REQUIRE(common.max_grad_norm >= 0, "optimizer: max_grad_norm must be >= 0, got ", common.max_grad_norm);
    auto& ctx = params.context();
    if constexpr (std::is_same_v<B, cuda>) ctx.template require<P>();
    for (int k = 0; k < Rule::state_buffers; ++k) {
      slots_[k] = Buffer<float, B>(ctx, params.count(), memory_kind::optimizer);
      fill(ctx, slots_[k].span(), 0.0f);
    }
    const OptimizerState init{};
    upload(ctx, state_.span(), &init, 1);
  }

  nn::Parameters<P, B>& parameters() const { return *params_; }
  LossScaler<B>& scaler() { return scaler_; }
  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  // schedule(step) sets the learning rate before each step.
  void set_schedule(std::function<float(std::int64_t)> schedule) { schedule_ = std::move(schedule); }
  // Steps taken (applied or skipped), as the schedule sees them.
  std::int64_t steps() const { return steps_; }

  // Zeroes the gradients at the start of each accumulation window.
  void zero_grad() {
    if (micro_ == 0) fill(params_->context(), params_->grads(), cast<grad_type>(0.0f));
  }

  // The policy's scaler: check (if the scaled-loss scope has not), fused step, scale update.
  // With accumulation_steps = N, only every Nth call steps.
  void step() {
    if (++micro_ < common_.accumulation_steps) return;
    micro_ = 0;
    scaler_.step(*this);
    scaler_.update();
  }

  // The fused pass, given a scaler's state (LossScaler::step calls this).
  void apply(const ScalerState* scaler_state) {
    if (schedule_) lr_ = schedule_(steps_);
    auto& ctx = params_->context();
    float* master = nullptr;
    if constexpr (nn::Parameters<P, B>::has_master) master = params_->master().data;
    for_each(ctx, 1,
             detail::PrepareStepOp{state_.data(), scaler_state, common_.max_grad_norm,
                                   1.0f / static_cast<float>(common_.accumulation_steps)});
    for_each(ctx, params_->count(),
             detail::FusedStepOp<param_type, grad_type, Rule, nn::Parameters<P, B>::has_master>{params_->weights().data, master, params_->grads().data,
                                                              slot_data(0), slot_data(1), state_.data(), rule_, lr_});
    for_each(ctx, 1, detail::AdvanceStateOp<Rule>{state_.data(), rule_});
    params_->mark_updated();
    ++steps_;
  }

  // Device step count (applied steps only); one sync.
  std::int64_t applied_steps() const { return download_one(params_->context(), static_cast<const OptimizerState*>(state_.data())).t; }
  Span<const float> state_buffer(int k) const { return slots_[k].span(); }

 private:
  float* slot_data(int k) { return k < Rule::state_buffers ? slots_[k].data() : nullptr; }

  nn::Parameters<P, B>* params_;
  Rule rule_;
  float lr_;
  CommonOptions common_;
  LossScaler<B> scaler_;
  Buffer<OptimizerState, B> state_;
  Buffer<float, B> slots_[2];
  std::function<float(std::int64_t)> schedule_;
  std::int64_t steps_ = 0;
  int micro_ = 0;
};

}  // namespace amp::optim
