#pragma once
// Row operations: for_each_row(ctx, rows, width, op) calls op(lanes, r) for
// every row r of `width` values, where `lanes` is the group of threads the
// backend gives one row. An op writes its math once, against the lanes:
//   lanes.sum(n, f)   the fp32 sum of f(c) over c < n, the same in every lane
//   lanes.max(n, f)   the largest f(c) over c < n (NaNs skipped), in every lane
//   lanes.each(n, f)  f(c) for every c < n, each c by one lane
// The host gives a row one thread (SerialLanes: loops in c order). CUDA gives
// it a warp, or a block of 256 threads for rows of 1024 values or more: lanes
// stride the row (coalesced loads) and reduce by warp shuffles in a fixed
// tree. Each backend's sums are deterministic; their orders differ.
#include <cmath>
#include <cstdint>

#include "amp/core/macros.hpp"

namespace amp {

struct SerialLanes {
  template <class F>
  AMP_HOST_DEVICE float sum(std::int64_t n, F f) const {
    float s = 0.0f;
    for (std::int64_t c = 0; c < n; ++c) s += f(c);
    return s;
  }
  template <class F>
  AMP_HOST_DEVICE float max(std::int64_t n, F f) const {
    float m = -INFINITY;
    for (std::int64_t c = 0; c < n; ++c) {
      const float v = f(c);
      m = v > m ? v : m;
    }
    return m;
  }
  template <class F>
  AMP_HOST_DEVICE void each(std::int64_t n, F f) const {
    for (std::int64_t c = 0; c < n; ++c) f(c);
  }
};

// Rows at least this wide get a block of threads on a GPU, narrower ones a warp.
inline constexpr std::int64_t block_row_width = 1024;

}  // namespace amp
