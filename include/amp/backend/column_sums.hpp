#pragma once
// Column sums of a rows x cols matrix given per element by f(r, c), in two
// fixed-order stages: chunks of 64 rows in fp32, then the chunks in fp64. A work
// item sums one chunk of Width neighbouring columns: on the CPU a vector's width
// (the rows of a chunk are read once, each into a vector of sums), on the GPU
// one column (neighbouring threads read neighbouring columns). Each column's sum
// runs in the same order for any width and thread count: deterministic, and the
// same bits on both backends.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "amp/backend/backend.hpp"
#include "amp/core/macros.hpp"
#include "amp/core/numeric.hpp"

namespace amp {

namespace detail {
inline constexpr std::int64_t column_chunk = 64;

template <class F, int Width>
struct ColumnPartialOp {
  F f;
  std::int64_t rows, cols;
  float* partial;  // [chunks x cols]
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t groups = cols / Width, item = static_cast<std::int64_t>(i);
    const std::int64_t chunk = item / groups, c0 = item % groups * Width;
    const std::int64_t end = (chunk + 1) * column_chunk < rows ? (chunk + 1) * column_chunk : rows;
    float acc[Width] = {};
    for (std::int64_t r = chunk * column_chunk; r < end; ++r)
      for (int j = 0; j < Width; ++j) acc[j] += f(r, c0 + j);
    for (int j = 0; j < Width; ++j) partial[chunk * cols + c0 + j] = acc[j];
  }
};

// The element column_sums reads most often: x[r][c] as fp32.
template <class T>
struct ValueAt {
  const T* x;
  std::int64_t cols;
  AMP_HOST_DEVICE float operator()(std::int64_t r, std::int64_t c) const { return cast<float>(x[r * cols + c]); }
};

struct ColumnTotalOp {
  const float* partial;
  std::int64_t chunks, cols;
  float* out;
  AMP_HOST_DEVICE void operator()(std::size_t c) const {
    double acc = 0.0;
    for (std::int64_t k = 0; k < chunks; ++k) acc += partial[k * cols + static_cast<std::int64_t>(c)];
    out[c] = static_cast<float>(acc);
  }
};
}  // namespace detail

// The partial sums column_sums needs: [ceil(rows / 64) x cols] floats.
inline std::size_t column_sum_partials(std::int64_t rows, std::int64_t cols) {
  return static_cast<std::size_t>((rows + detail::column_chunk - 1) / detail::column_chunk * cols);
}

// out[c] = sum over r of f(r, c), through `partial` (column_sum_partials floats).
template <Backend B, class F>
void column_sums(Context<B>& ctx, std::int64_t rows, std::int64_t cols, F f, float* partial, float* out) {
  const std::int64_t chunks = (rows + detail::column_chunk - 1) / detail::column_chunk;
  constexpr int vector_width = std::is_same_v<B, host> ? 16 : 1;  // 16 floats: one AVX-512 register
  if (cols % vector_width == 0)
    for_each(ctx, static_cast<std::size_t>(chunks * cols / vector_width),
             detail::ColumnPartialOp<F, vector_width>{f, rows, cols, partial}, detail::column_chunk * vector_width);
  else
    for_each(ctx, static_cast<std::size_t>(chunks * cols), detail::ColumnPartialOp<F, 1>{f, rows, cols, partial},
             detail::column_chunk);
  for_each(ctx, static_cast<std::size_t>(cols), detail::ColumnTotalOp{partial, chunks, cols, out},
           static_cast<std::size_t>(chunks));
}

}  // namespace amp
