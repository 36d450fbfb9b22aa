#pragma once
// Learning-rate schedules: functions of the step index (skipped steps count,
// as with PyTorch's schedulers). An optimizer evaluates its Schedule in the
// step's prologue, on the device, from the step count kept there: no host work
// per step, and a replayed CUDA graph follows the schedule as eager steps do.
// StepLR, CosineLR and LinearWarmup are the named forms; each converts to a
// Schedule and evaluates through it, so there is one piece of math. Any other
// function of the step is tabulated once (FusedOptimizer::set_schedule(f, steps)).
// As in PyTorch, a schedule starts from the optimizer's rate unless it names
// its own base_lr.
#include <cmath>
#include <cstdint>
#include <optional>

#include "amp/core/error.hpp"
#include "amp/core/macros.hpp"

namespace amp::optim {

struct Schedule {
  enum class kind : int { constant, step, cosine, table };
  static constexpr float optimizer_lr = -1.0f;  // base_lr: the optimizer's rate, filled in by set_schedule
  kind k = kind::constant;
  float base_lr = optimizer_lr;
  long long step_size = 1;  // step: lr * gamma^(step / step_size)
  float gamma = 0.1f;
  long long total_steps = 1;  // cosine: base_lr -> min_lr over total_steps, then min_lr
  float min_lr = 0.0f;
  long long warmup_steps = 0;  // a linear ramp to the schedule's start first
  const float* table = nullptr;  // table: the rate of each step (backend memory), the last one after them
  long long table_size = 0;

  AMP_HOST_DEVICE float operator()(long long step) const {
    if (step < warmup_steps) return at(0) * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
    return at(step - warmup_steps);
  }

 private:
  AMP_HOST_DEVICE float at(long long step) const {
    switch (k) {
      case kind::step: return base_lr * powf(gamma, static_cast<float>(step / step_size));
      case kind::cosine: {
        if (step >= total_steps) return min_lr;
        const double progress = static_cast<double>(step) / static_cast<double>(total_steps);
        return min_lr + 0.5f * (base_lr - min_lr) * static_cast<float>(1.0 + cos(3.141592653589793 * progress));
      }
      case kind::table: return table[step < table_size ? step : table_size - 1];
      default: return base_lr;
    }
  }
};

namespace detail {
// A named form's base rate as a Schedule holds it: given (and valid), or the optimizer's.
inline float base_rate(const std::optional<float>& base_lr, const char* form) {
  if (!base_lr) return Schedule::optimizer_lr;
  AMP_REQUIRE(std::isfinite(*base_lr) && *base_lr >= 0, form, ": base_lr must be finite and >= 0, got ", *base_lr);
  return *base_lr;
}
// A named form evaluated on its own has no optimizer to take the rate from.
inline Schedule standalone(const Schedule& s, const char* form) {
  AMP_REQUIRE(s.base_lr != Schedule::optimizer_lr, form, ": evaluated on its own, a schedule needs base_lr (under an "
              "optimizer's set_schedule it defaults to the optimizer's lr)");
  return s;
}
}  // namespace detail

// lr * gamma^(step / step_size); lr is base_lr, or the optimizer's.
struct StepLR {
  std::optional<float> base_lr = std::nullopt;
  std::int64_t step_size = 0;
  float gamma = 0.1f;
  operator Schedule() const {
    AMP_REQUIRE(step_size > 0, "StepLR: step_size must be > 0, got ", step_size);
    Schedule s;
    s.k = Schedule::kind::step, s.base_lr = detail::base_rate(base_lr, "StepLR"), s.step_size = step_size, s.gamma = gamma;
    return s;
  }
  float operator()(std::int64_t step) const { return detail::standalone(*this, "StepLR")(step); }
};

// Cosine annealing from base_lr (default: the optimizer's) to min_lr over total_steps, then min_lr.
struct CosineLR {
  std::optional<float> base_lr = std::nullopt;
  std::int64_t total_steps = 0;
  float min_lr = 0.0f;
  operator Schedule() const {
    AMP_REQUIRE(total_steps > 0, "CosineLR: total_steps must be > 0, got ", total_steps);
    AMP_REQUIRE(std::isfinite(min_lr) && min_lr >= 0, "CosineLR: min_lr must be finite and >= 0, got ", min_lr);
    Schedule s;
    s.k = Schedule::kind::cosine, s.base_lr = detail::base_rate(base_lr, "CosineLR"), s.total_steps = total_steps;
    s.min_lr = min_lr;
    return s;
  }
  float operator()(std::int64_t step) const { return detail::standalone(*this, "CosineLR")(step); }
};

// Ramps linearly to inner(0) over warmup_steps, then follows inner from its start.
template <class Inner>
struct LinearWarmup {
  std::int64_t warmup_steps = 0;
  Inner inner;
  operator Schedule() const {
    AMP_REQUIRE(warmup_steps >= 0, "LinearWarmup: warmup_steps must be >= 0, got ", warmup_steps);
    Schedule s = inner;
    s.warmup_steps = warmup_steps;
    return s;
  }
  float operator()(std::int64_t step) const { return detail::standalone(*this, "LinearWarmup")(step); }
};

}  // namespace amp::optim
