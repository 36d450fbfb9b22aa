#pragma once
// A row op over runs (backend/rows.hpp), shared by the host test and its CUDA
// twin: each row's sum (sum_runs) and a copy doubled (each_run), through
// load_run and store_run.
#include <cstddef>
#include <cstdint>

#include "amp/backend/rows.hpp"
#include "amp/core/macros.hpp"

namespace amp::test {

template <class T>
struct SumAndDoubleRunsOp {
  const T* x;
  std::int64_t ld, width;
  float* sums;
  T* y;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const T* row = x + static_cast<std::int64_t>(r) * ld;
    const float s = sum_runs(lanes, width, [&](std::int64_t c, std::int64_t len) {
      float v[run_length];
      load_run(row + c, len, v);
      float t = 0.0f;
      for (const float e : v) t += e;
      return t;
    });
    lanes.each(1, [&](std::int64_t) { sums[r] = s; });
    each_run(lanes, width, [&](std::int64_t c, std::int64_t len) {
      float v[run_length];
      load_run(row + c, len, v);
      for (float& e : v) e *= 2.0f;
      store_run(y + static_cast<std::int64_t>(r) * ld + c, len, v);
    });
  }
};

}  // namespace amp::test
