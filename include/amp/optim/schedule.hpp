#pragma once
// Learning-rate schedules: functions of the step index (skipped steps count,
// as with PyTorch's schedulers). An optimizer evaluates its Schedule in the
// step's prologue, on the device, from the step count kept there: no host work
// per step, and a replayed CUDA graph follows the schedule as eager steps do.
// StepLR, CosineLR and LinearWarmup are the named forms; each converts to a
// Schedule and evaluates through it, so there is one piece of math. Any other
// function of the step is tabulated once (FusedOptimizer::set_schedule(f, steps)).
#include <cmath>
#include <cstdint>

#include "amp/core/macros.hpp"

namespace amp::optim {

struct Schedule {
  enum class kind : int { constant, step, cosine, table };
  kind k = kind::constant;
  float base_lr = 0.0f;
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

// lr * gamma^(step / step_size)
struct StepLR {
  float base_lr;
  std::int64_t step_size;
  float gamma = 0.1f;
  operator Schedule() const {
    Schedule s;
    s.k = Schedule::kind::step, s.base_lr = base_lr, s.step_size = step_size, s.gamma = gamma;
    return s;
  }
  float operator()(std::int64_t step) const { return Schedule(*this)(step); }
};

// Cosine annealing from base_lr to min_lr over total_steps, then min_lr.
struct CosineLR {
  float base_lr;
  std::int64_t total_steps;
  float min_lr = 0.0f;
  operator Schedule() const {
    Schedule s;
    s.k = Schedule::kind::cosine, s.base_lr = base_lr, s.total_steps = total_steps, s.min_lr = min_lr;
    return s;
  }
  float operator()(std::int64_t step) const { return Schedule(*this)(step); }
};

// Ramps linearly to inner(0) over warmup_steps, then follows inner from its start.
template <class Inner>
struct LinearWarmup {
  std::int64_t warmup_steps;
  Inner inner;
  operator Schedule() const {
    Schedule s = inner;
    s.warmup_steps = warmup_steps;
    return s;
  }
  float operator()(std::int64_t step) const { return Schedule(*this)(step); }
};

}  // namespace amp::optim
