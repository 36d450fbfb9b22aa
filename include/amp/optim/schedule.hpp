#pragma once
// Learning-rate schedules: plain functions of the step index (skipped steps
// count, as with PyTorch's schedulers). An optimizer applies one on the host
// before each step, so the schedule costs no device work.
#include <cmath>
#include <cstdint>

namespace amp::optim {

// lr * gamma^(step / step_size)
struct StepLR {
  float base_lr;
  std::int64_t step_size;
  float gamma = 0.1f;
  float operator()(std::int64_t step) const {
    return base_lr * std::pow(gamma, static_cast<float>(step / step_size));
  }
};

// Cosine annealing from base_lr to min_lr over total_steps, then min_lr.
struct CosineLR {
  float base_lr;
  std::int64_t total_steps;
  float min_lr = 0.0f;
  float operator()(std::int64_t step) const {
    if (step >= total_steps) return min_lr;
    const double progress = static_cast<double>(step) / static_cast<double>(total_steps);
    return min_lr + 0.5f * (base_lr - min_lr) * static_cast<float>(1.0 + std::cos(3.141592653589793 * progress));
  }
};

// Ramps linearly to inner(0) over warmup_steps, then follows inner from its start.
template <class Inner>
struct LinearWarmup {
  std::int64_t warmup_steps;
  Inner inner;
  float operator()(std::int64_t step) const {
    if (step < warmup_steps)
      return inner(0) * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
    return inner(step - warmup_steps);
  }
};

}  // namespace amp::optim
