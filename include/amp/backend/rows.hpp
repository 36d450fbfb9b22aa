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
// Runs (below) read a row 8 values at a time: 16-byte loads on a GPU.
#include <cmath>
#include <cstdint>

#include "amp/core/macros.hpp"
#include "amp/core/numeric.hpp"

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

// A run: run_length neighbouring values of a row, which one lane reads and
// writes together. On a GPU a whole run at a 16-byte aligned address moves in
// 16-byte words (8 halves or bf16 per load, instead of 8 loads); a run
// elsewhere (a misaligned row, the short tail of a row) moves value by value.
// The host reads runs value by value (its compiler vectorises the loops).
inline constexpr int run_length = 8;

namespace detail {
template <class T>
AMP_HOST_DEVICE inline bool whole_aligned_run(const T* p, std::int64_t len) {
  return run_length * sizeof(T) % 16 == 0 && len == run_length && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}
}  // namespace detail

// v[j] = p[j] as fp32 for j < len; 0 beyond.
template <class T>
AMP_HOST_DEVICE inline void load_run(const T* p, std::int64_t len, float (&v)[run_length]) {
#if AMP_DEVICE_CODE
  if constexpr (run_length * sizeof(T) % 16 == 0) {
    if (detail::whole_aligned_run(p, len)) {
      constexpr int per_word = static_cast<int>(16 / sizeof(T));
      T raw[run_length];
      for (int w = 0; w < run_length / per_word; ++w) {
        const uint4 word = reinterpret_cast<const uint4*>(p)[w];
        memcpy(raw + w * per_word, &word, 16);
      }
      for (int j = 0; j < run_length; ++j) v[j] = cast<float>(raw[j]);
      return;
    }
  }
#endif
  for (int j = 0; j < run_length; ++j) v[j] = j < len ? cast<float>(p[j]) : 0.0f;
}

// p[j] = cast<T>(v[j]) for j < len.
template <class T>
AMP_HOST_DEVICE inline void store_run(T* p, std::int64_t len, const float (&v)[run_length]) {
#if AMP_DEVICE_CODE
  if constexpr (run_length * sizeof(T) % 16 == 0) {
    if (detail::whole_aligned_run(p, len)) {
      constexpr int per_word = static_cast<int>(16 / sizeof(T));
      T raw[run_length];
      for (int j = 0; j < run_length; ++j) raw[j] = cast<T>(v[j]);
      for (int w = 0; w < run_length / per_word; ++w) {
        uint4 word;
        memcpy(&word, raw + w * per_word, 16);
        reinterpret_cast<uint4*>(p)[w] = word;
      }
      return;
    }
  }
#endif
  for (int j = 0; j < len; ++j) p[j] = cast<T>(v[j]);
}

// f(c, len) for the runs [c, c + len) of a row of n values, each by one lane;
// len is run_length but at the row's tail.
template <class Lanes, class F>
AMP_HOST_DEVICE inline void each_run(const Lanes& lanes, std::int64_t n, F f) {
  lanes.each((n + run_length - 1) / run_length, [&](std::int64_t r) {
    const std::int64_t c = r * run_length;
    f(c, n - c < run_length ? n - c : std::int64_t{run_length});
  });
}

// lanes.sum over the runs of a row of n values of f(c, len), a run's own sum.
template <class Lanes, class F>
AMP_HOST_DEVICE inline float sum_runs(const Lanes& lanes, std::int64_t n, F f) {
  return lanes.sum((n + run_length - 1) / run_length, [&](std::int64_t r) {
    const std::int64_t c = r * run_length;
    return f(c, n - c < run_length ? n - c : std::int64_t{run_length});
  });
}

}  // namespace amp
