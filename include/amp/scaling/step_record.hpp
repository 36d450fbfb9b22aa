#pragma once
// The record a loss scaler's check hands an optimizer's update.
#include "amp/scaling/grad_stats.hpp"

namespace amp {

// What an optimizer's update consumes (device pointers; no host sync): the
// gradients are the models' arenas times 1 / *scale x factor, or the fp32
// copy when unscaled; the update is skipped on the device when *found_inf
// is set or the statistics overflowed, and clipping reads their norm.
struct StepRecord {
  const float* scale = nullptr;            // nullptr: no scaling (or unscaled already)
  const int* found_inf = nullptr;          // this optimizer's verdict
  const GradStats* stats = nullptr;        // of the gradients the update reads
  float factor = 1.0f;                     // data parallel's 1/ranks, not applied yet
  const float* const* unscaled = nullptr;  // the fp32 copy per store and trained role, in order; nullptr: the arenas
};

namespace detail {
// How a scaler's step(opt) reaches an optimizer's update (not the user's surface).
struct StepAccess {
  template <class Optimizer>
  static void update(Optimizer& opt, const StepRecord& record) {
    opt.update(record);
  }
};
}  // namespace detail

}  // namespace amp
