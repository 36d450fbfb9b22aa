#pragma once
// A three-way reduction (sum of squares, max |x|, non-finite count) used by the
// host test and its CUDA twin.
#include "amp/core/numeric.hpp"

namespace amp::test {

struct Stats {
  float sumsq = 0;
  float maxabs = 0;
  int nonfinite = 0;
};

template <class T>
struct StatsOf {
  const T* x;
  AMP_HOST_DEVICE Stats operator()(std::size_t i) const {
    const float v = cast<float>(x[i]);
    if (!is_finite(v)) return {0.0f, 0.0f, 1};
    return {v * v, v < 0 ? -v : v, 0};
  }
};

struct CombineStats {
  AMP_HOST_DEVICE Stats operator()(const Stats& a, const Stats& b) const {
    return {a.sumsq + b.sumsq, a.maxabs > b.maxabs ? a.maxabs : b.maxabs, a.nonfinite + b.nonfinite};
  }
};

}  // namespace amp::test
