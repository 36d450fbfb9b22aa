#pragma once
// Column sums of a rows x cols matrix given per element by f(r, c), in a fixed
// tree: chunks of 64 rows in fp32, then the chunks in fp64, in chunk order;
// past 32 chunks, in strands first (strand s: chunks s, s + S, s + 2S, ... in
// order, S a power of two near sqrt(chunks)), then the S strands in order.
// The tree depends on the shape alone: deterministic, and the same bits on
// both backends. Each stage is a grid of independent cells: on the CPU a cell
// sums a vector's width of columns (the rows of a chunk are read once, each
// into a vector of sums), on the GPU one column, neighbouring threads reading
// neighbouring columns (coalesced); the strands keep a tall matrix's totals
// from being a serial loop per column.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "amp/backend/backend.hpp"
#include "amp/core/macros.hpp"
#include "amp/core/numeric.hpp"

namespace amp {

namespace detail {
inline constexpr std::int64_t column_chunk = 64;
inline constexpr std::int64_t column_direct_chunks = 32;  // up to this many chunks: no strands

inline std::int64_t column_chunks(std::int64_t rows) { return (rows + column_chunk - 1) / column_chunk; }
inline std::int64_t column_strands(std::int64_t chunks) {
  if (chunks <= column_direct_chunks) return 0;
  std::int64_t s = 1;
  while (s * s < chunks) s *= 2;
  return s;
}

// partial[chunk][c0 .. c0 + Width): the chunk's rows summed in fp32, in row order.
template <class F, int Width>
struct ColumnPartialOp {
  F f;
  std::int64_t rows, cols;
  float* partial;  // [chunks x cols]
  AMP_HOST_DEVICE void operator()(std::int64_t chunk, std::int64_t group) const {
    const std::int64_t c0 = group * Width;
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

// strand[s][c] = the chunks s, s + strands, ... of column c, in fp64.
struct ColumnStrandOp {
  const float* partial;
  std::int64_t chunks, strands, cols;
  double* strand;  // [strands x cols]
  AMP_HOST_DEVICE void operator()(std::int64_t s, std::int64_t c) const {
    double acc = 0.0;
    for (std::int64_t k = s; k < chunks; k += strands) acc += partial[k * cols + c];
    strand[s * cols + c] = acc;
  }
};

// Column c's total from its n chunks (fp32) or strands (fp64), in order;
// written, or (Add) added to out[c] in fp32, rounded once to Out.
template <class Out, bool Add>
struct ColumnTotalOp {
  const float* partial;  // nullptr: from the strands
  const double* strand;
  std::int64_t n, cols;
  Out* out;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto c = static_cast<std::int64_t>(i);
    double acc = 0.0;
    if (partial)
      for (std::int64_t k = 0; k < n; ++k) acc += partial[k * cols + c];
    else
      for (std::int64_t k = 0; k < n; ++k) acc += strand[k * cols + c];
    const float total = static_cast<float>(acc);
    out[i] = cast<Out>(Add ? cast<float>(out[i]) + total : total);
  }
};

template <bool Add, Backend B, class F, class Out>
void column_sums_into(Context<B>& ctx, std::int64_t rows, std::int64_t cols, F f, float* partial, Out* out) {
  const std::int64_t chunks = column_chunks(rows), strands = column_strands(chunks);
  constexpr int vector_width = std::is_same_v<B, host> ? 16 : 1;  // 16 floats: one AVX-512 register
  const auto work = static_cast<std::size_t>(column_chunk * vector_width);
  if (cols % vector_width == 0)
    for_each_cell(ctx, chunks, cols / vector_width, ColumnPartialOp<F, vector_width>{f, rows, cols, partial}, work);
  else
    for_each_cell(ctx, chunks, cols, ColumnPartialOp<F, 1>{f, rows, cols, partial}, work / vector_width);
  const auto n = static_cast<std::size_t>(cols);
  if (strands == 0) {
    for_each(ctx, n, ColumnTotalOp<Out, Add>{partial, nullptr, chunks, cols, out}, static_cast<std::size_t>(chunks));
    return;
  }
  double* strand = reinterpret_cast<double*>(partial + (chunks * cols + 1) / 2 * 2);
  for_each_cell(ctx, strands, cols, ColumnStrandOp{partial, chunks, strands, cols, strand},
                static_cast<std::size_t>(chunks / strands));
  for_each(ctx, n, ColumnTotalOp<Out, Add>{nullptr, strand, strands, cols, out}, static_cast<std::size_t>(strands));
}
}  // namespace detail

// The scratch column_sums needs, in floats: the chunks' partial sums
// [ceil(rows / 64) x cols], then (tall matrices) the strands' fp64 sums.
inline std::size_t column_sum_partials(std::int64_t rows, std::int64_t cols) {
  const std::int64_t chunks = detail::column_chunks(rows);
  return static_cast<std::size_t>((chunks * cols + 1) / 2 * 2 + 2 * detail::column_strands(chunks) * cols);
}

// out[c] = sum over r of f(r, c), through `partial` (column_sum_partials
// floats, 8-byte aligned). Two launches, three past 32 x 64 rows.
template <Backend B, class F>
void column_sums(Context<B>& ctx, std::int64_t rows, std::int64_t cols, F f, float* partial, float* out) {
  detail::column_sums_into<false>(ctx, rows, cols, f, partial, out);
}

// into[c] += sum over r of f(r, c): the sum added in fp32, rounded once to Out
// (a bias gradient accumulating in its stored type).
template <Backend B, class F, class Out>
void add_column_sums(Context<B>& ctx, std::int64_t rows, std::int64_t cols, F f, float* partial, Out* into) {
  detail::column_sums_into<true>(ctx, rows, cols, f, partial, into);
}

}  // namespace amp
