#pragma once
// A cast that also writes its transpose, in 32 x 32 tiles on the GPU. A row op
// (a warp a row) writes the transpose's bytes `rows` apart, one byte per
// store; here a block reads a tile of the input along its rows (coalesced),
// writes the codes along the same rows, stages them in shared memory, and
// writes the transpose along the transpose's rows (coalesced too). The math of
// one element is the caller's op, the same the host runs in its row loop:
//   op.factor()       a value read once per thread (an FP8 scale, from device memory)
//   op.value(r, c)    element (r, c) of the input, widened to fp32
//   op.encode(v, f)   its output from that value and the factor
// and row_max, when given, gets the largest |value| of each row over each
// chunk of cast_transposed_chunk columns (NaNs skipped, as lanes.max does):
// [rows x cast_transposed_partials(ctx, cols)], for one reduction to finish. Max is
// exact, so the partial order does not change the result.
#include <cmath>
#include <cstdint>

#include "amp/backend/cuda/context.cuh"
#include "amp/backend/cuda/error.cuh"

namespace amp {

inline constexpr std::int64_t cast_transposed_tile = 32;
inline constexpr std::int64_t cast_transposed_chunk = 16 * cast_transposed_tile;  // columns a block walks

// Partial maxima per row that cast_transposed writes for `cols` columns.
inline std::int64_t cast_transposed_partials(const Context<cuda>&, std::int64_t cols) {
  return (cols + cast_transposed_chunk - 1) / cast_transposed_chunk;
}

namespace detail {
// Block (32, 8): thread (x, y) takes column x of the tile and rows y, y + 8,
// y + 16, y + 24; a warp is one y, so a row's lanes reduce by shuffles.
template <class Op, class U>
__global__ void cast_transposed_kernel(std::int64_t rows, std::int64_t cols, Op op, U* out, U* out_t,
                                       float* row_max) {
  constexpr int tile = static_cast<int>(cast_transposed_tile), sweeps = tile / 8;
  // Rows padded to an odd number of 4-byte words: a column of the tile reads 32 banks.
  __shared__ U staged[tile][tile + (sizeof(U) < 4 ? 4 / sizeof(U) : 1)];
  const int x = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.x) * tile;
  const std::int64_t c_begin = static_cast<std::int64_t>(blockIdx.y) * cast_transposed_chunk;
  const std::int64_t c_end = c_begin + cast_transposed_chunk < cols ? c_begin + cast_transposed_chunk : cols;
  const float factor = op.factor();
  float largest[sweeps];
  for (int k = 0; k < sweeps; ++k) largest[k] = -INFINITY;
  for (std::int64_t c0 = c_begin; c0 < c_end; c0 += tile) {
    for (int k = 0; k < sweeps; ++k) {
      const std::int64_t r = r0 + y + 8 * k, c = c0 + x;
      if (r < rows && c < c_end) {
        const float v = op.value(r, c);
        const float m = v < 0.0f ? -v : v;
        largest[k] = m > largest[k] ? m : largest[k];
        const U code = op.encode(v, factor);
        out[r * cols + c] = code;
        staged[y + 8 * k][x] = code;
      }
    }
    __syncthreads();
    for (int k = 0; k < sweeps; ++k) {
      const std::int64_t c = c0 + y + 8 * k, r = r0 + x;
      if (r < rows && c < c_end) out_t[c * rows + r] = staged[x][y + 8 * k];
    }
    __syncthreads();  // the tile is read before the next one is staged
  }
  if (!row_max) return;
  for (int k = 0; k < sweeps; ++k) {
    float m = largest[k];
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, m, o);
      m = other > m ? other : m;
    }
    const std::int64_t r = r0 + y + 8 * k;
    if (x == 0 && r < rows) row_max[r * gridDim.y + blockIdx.y] = m;
  }
}
}  // namespace detail

// out [rows x cols] = op's codes, out_t [cols x rows] their transpose, and
// (when row_max is given) the rows' partial maxima of |value|. One launch;
// deterministic.
template <class Op, class U>
void cast_transposed(Context<cuda>& ctx, std::int64_t rows, std::int64_t cols, const Op& op, U* out, U* out_t,
                     float* row_max) {
  if (rows == 0 || cols == 0) return;
  ctx.activate();
  ctx.count_launch();
  const dim3 blocks(static_cast<unsigned>((rows + cast_transposed_tile - 1) / cast_transposed_tile),
                    static_cast<unsigned>(cast_transposed_partials(ctx, cols)));
  const dim3 threads(static_cast<unsigned>(cast_transposed_tile), 8);
  detail::cast_transposed_kernel<<<blocks, threads, 0, ctx.stream()>>>(rows, cols, op, out, out_t, row_max);
  AMP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace amp
