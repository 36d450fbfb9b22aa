#pragma once
// GPU launches of the shared functors: grid-stride for_each and for_each_cell
// kernels, row ops on warps or blocks, and CUB's (segmented) transform-reduce
// over a counting iterator (the map takes an index), all on the context's
// stream, writing results to device memory.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <map>
#include <utility>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_segmented_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include "amp/backend/cuda/context.cuh"
#include "amp/backend/groups.hpp"
#include "amp/backend/rows.hpp"

namespace amp {

namespace detail {
template <class F>
__global__ void for_each_kernel(std::size_t n, F f) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    f(i);
}
}  // namespace detail

// f(i) for every i in [0, n); work_per_item is the host's hint (one thread per item here).
template <class F>
void for_each(Context<cuda>& ctx, std::size_t n, F f, std::size_t /*work_per_item*/ = 1) {
  if (n == 0) return;
  ctx.activate();
  ctx.count_launch();
  constexpr unsigned threads = 256;
  const std::size_t wanted = (n + threads - 1) / threads;
  const std::size_t cap = static_cast<std::size_t>(ctx.multiprocessors()) * 16;
  const auto blocks = static_cast<unsigned>(wanted < cap ? wanted : cap);
  detail::for_each_kernel<<<blocks, threads, 0, ctx.stream()>>>(n, f);
  AMP_CUDA_CHECK(cudaGetLastError());
}

namespace detail {
// Threads along x take neighbouring columns (coalesced), along y rows; both
// grid-stride, so no thread divides an index.
template <class F>
__global__ void cells_kernel(std::int64_t rows, std::int64_t cols, F f) {
  const std::int64_t c0 = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t r_step = static_cast<std::int64_t>(gridDim.y) * blockDim.y;
  const std::int64_t c_step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.y * static_cast<std::int64_t>(blockDim.y) + threadIdx.y; r < rows; r += r_step)
    for (std::int64_t c = c0; c < cols; c += c_step) f(r, c);
}
}  // namespace detail

// f(r, c) for every cell of a rows x cols grid: a block of 256 threads covers
// up to 32 neighbouring columns of 256 / 32 or more rows (work_per_item is the host's hint).
template <class F>
void for_each_cell(Context<cuda>& ctx, std::int64_t rows, std::int64_t cols, F f, std::size_t /*work_per_item*/ = 1) {
  if (rows <= 0 || cols <= 0) return;
  ctx.activate();
  ctx.count_launch();
  unsigned x = 1;
  while (x < 32 && x < cols) x *= 2;
  const unsigned y = 256 / x;
  const std::int64_t cap = static_cast<std::int64_t>(ctx.multiprocessors()) * 16;
  const std::int64_t gx = std::min<std::int64_t>((cols + x - 1) / x, cap);
  const std::int64_t gy = std::min<std::int64_t>({(rows + y - 1) / y, std::max<std::int64_t>(cap / gx, 1), 65535});
  detail::cells_kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(x, y), 0, ctx.stream()>>>(
      rows, cols, f);
  AMP_CUDA_CHECK(cudaGetLastError());
}

namespace detail {
constexpr unsigned full_warp = 0xffffffffu;

struct PlusOp {
  __host__ __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __host__ __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The lanes of one row (backend/rows.hpp): a warp's 32 threads, or (Block) a
// whole block's, striding the row. A warp reduces by shuffles; a block then
// combines its warps' values from shared memory in warp order. The host
// branches are never taken (this exists on the device only); they keep the
// row ops' host instantiations compiling.
template <bool Block>
struct GpuLanes {
  float* partials;  // Block: shared, one per warp
  template <class F>
  __host__ __device__ float sum(std::int64_t n, F f) const { return reduce(n, f, 0.0f, PlusOp{}); }
  template <class F>
  __host__ __device__ float max(std::int64_t n, F f) const { return reduce(n, f, -INFINITY, MaxOp{}); }
  template <class F>
  __host__ __device__ void each(std::int64_t n, F f) const {
#ifdef __CUDA_ARCH__
    for (std::int64_t c = first(); c < n; c += stride()) f(c);
#else
    for (std::int64_t c = 0; c < n; ++c) f(c);
#endif
  }

 private:
  template <class F, class Op>
  __host__ __device__ float reduce(std::int64_t n, F f, float v, Op op) const {
#ifdef __CUDA_ARCH__
    for (std::int64_t c = first(); c < n; c += stride()) v = op(v, f(c));
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(full_warp, v, o));
    if constexpr (Block) {
      __syncthreads();  // the previous reduction's readers are done with the partials
      if (threadIdx.x % 32 == 0) partials[threadIdx.x / 32] = v;
      __syncthreads();
      v = partials[0];
      for (unsigned w = 1; w < blockDim.x / 32; ++w) v = op(v, partials[w]);
    }
#else
    for (std::int64_t c = 0; c < n; ++c) v = op(v, f(c));
#endif
    return v;
  }
#ifdef __CUDA_ARCH__
  __device__ static std::int64_t first() { return Block ? threadIdx.x : threadIdx.x % 32; }
  __device__ static std::int64_t stride() { return Block ? blockDim.x : 32; }
#endif
};

template <class Op>
__global__ void rows_by_warp_kernel(std::size_t rows, Op op) {
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  const GpuLanes<false> lanes{nullptr};
  for (std::size_t r = (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x) / 32; r < rows; r += warps)
    op(lanes, r);
}

template <class Op>
__global__ void rows_by_block_kernel(std::size_t rows, Op op) {
  __shared__ float partials[32];
  const GpuLanes<true> lanes{partials};
  for (std::size_t r = blockIdx.x; r < rows; r += gridDim.x) op(lanes, r);
}
}  // namespace detail

// op(lanes, r) for every row r of width values (backend/rows.hpp): a warp a
// row, or a block of 256 threads a row from block_row_width values up.
template <class Op>
void for_each_row(Context<cuda>& ctx, std::size_t rows, std::int64_t width, Op op) {
  if (rows == 0) return;
  ctx.activate();
  ctx.count_launch();
  constexpr unsigned threads = 256;
  const std::size_t cap = static_cast<std::size_t>(ctx.multiprocessors()) * 16;
  if (width >= block_row_width) {
    const auto blocks = static_cast<unsigned>(rows < cap ? rows : cap);
    detail::rows_by_block_kernel<<<blocks, threads, 0, ctx.stream()>>>(rows, op);
  } else {
    const std::size_t wanted = (rows + threads / 32 - 1) / (threads / 32);
    const auto blocks = static_cast<unsigned>(wanted < cap ? wanted : cap);
    detail::rows_by_warp_kernel<<<blocks, threads, 0, ctx.stream()>>>(rows, op);
  }
  AMP_CUDA_CHECK(cudaGetLastError());
}

namespace detail {
template <class T, class Prologue>
struct PrologueOp {
  T* slot;
  Prologue prologue;
  __device__ void operator()(std::size_t) const { *slot = prologue(); }
};
struct LaunchOn {
  Context<cuda>* ctx;
  template <class F>
  void each(std::size_t n, F f) const {
    for_each(*ctx, n, f);
  }
  template <class Op>
  void rows(std::size_t rows, std::int64_t width, Op op) const {
    for_each_row(*ctx, rows, width, op);
  }
};
}  // namespace detail

// A one-item prologue, then launches that read its value (see the host's
// twin): *slot = prologue() on the device, and body(launch, slot) launches
// kernels that read *slot there, so nothing waits for the host.
template <class T, class Prologue, class Body>
void after_prologue(Context<cuda>& ctx, T* slot, Prologue prologue, Body body) {
  for_each(ctx, 1, detail::PrologueOp<T, Prologue>{slot, prologue});
  body(detail::LaunchOn{&ctx}, static_cast<const T*>(slot));
}

namespace detail {
template <class T>
struct ZeroOf {
  __host__ __device__ T operator()(std::size_t) const { return T{}; }
};
template <class T>
struct KeepFirst {
  __host__ __device__ T operator()(const T& a, const T&) const { return a; }
};
}  // namespace detail

// Sizes the workspace of a transform_reduce of n items of T now (a model's
// build), so that the reductions of a training step allocate nothing.
template <class T>
void reserve_reduction(Context<cuda>& ctx, std::size_t n) {
  thrust::counting_iterator<std::size_t> first(0);
  std::size_t temp_bytes = 0;
  AMP_CUDA_CHECK(cub::DeviceReduce::TransformReduce(nullptr, temp_bytes, first, static_cast<T*>(nullptr), n,
                                                    detail::KeepFirst<T>{}, detail::ZeroOf<T>{}, T{}, ctx.stream()));
  ctx.scratch<std::byte>(scratch_slot::reduction, temp_bytes);
}

namespace detail {
// CUB's temporary bytes for a reduction of n items of this (T, map, combine)
// on this device, asked once and remembered: the loop's reductions do no
// sizing work (and a captured graph records only the reduction).
template <class T, class Map, class Combine>
std::size_t reduction_bytes(const Context<cuda>& ctx, std::size_t n, Map map, Combine combine, T init, T* out) {
  thread_local std::map<std::pair<int, std::size_t>, std::size_t> known;
  const auto key = std::make_pair(ctx.device(), n);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  std::size_t bytes = 0;
  AMP_CUDA_CHECK(cub::DeviceReduce::TransformReduce(nullptr, bytes, thrust::counting_iterator<std::size_t>(0), out, n,
                                                    combine, map, init, ctx.stream()));
  return known[key] = bytes;
}
}  // namespace detail

// *out = combine over map(i), i in [0, n), in device memory; no host sync.
// CUB's reduction: deterministic for a given n and device (a fixed tree).
template <class T, class Map, class Combine>
void transform_reduce(Context<cuda>& ctx, std::size_t n, Map map, Combine combine, T init, T* out) {
  ctx.activate();
  ctx.count_launch();
  thrust::counting_iterator<std::size_t> first(0);
  std::size_t temp_bytes = detail::reduction_bytes(ctx, n, map, combine, init, out);
  void* temp = ctx.scratch<std::byte>(scratch_slot::reduction, temp_bytes);
  AMP_CUDA_CHECK(
      cub::DeviceReduce::TransformReduce(temp, temp_bytes, first, out, n, combine, map, init, ctx.stream()));
}

// out[s] = combine over map(i), i in [begins[s], ends[s]), for each of
// `segments` segments (offsets in device memory): CUB's segmented reduction,
// a block per segment, one launch however many segments; no host sync.
// Deterministic for given segments and device. Segments of a few ten
// thousand items keep every SM busy: cut a long range into several.
template <class T, class Map, class Combine>
void segmented_transform_reduce(Context<cuda>& ctx, std::size_t segments, const std::size_t* begins,
                                const std::size_t* ends, Map map, Combine combine, T init, T* out) {
  if (segments == 0) return;
  ctx.activate();
  ctx.count_launch();
  const auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::size_t>(0), map);
  const auto count = static_cast<std::int64_t>(segments);
  thread_local std::map<std::pair<int, std::size_t>, std::size_t> known;  // CUB's bytes, asked once per size
  const auto key = std::make_pair(ctx.device(), segments);
  auto it = known.find(key);
  if (it == known.end()) {
    std::size_t bytes = 0;
    AMP_CUDA_CHECK(cub::DeviceSegmentedReduce::Reduce(nullptr, bytes, in, out, count, begins, ends, combine, init,
                                                      ctx.stream()));
    it = known.emplace(key, bytes).first;
  }
  std::size_t bytes = it->second;
  void* temp = ctx.scratch<std::byte>(scratch_slot::reduction, bytes);
  AMP_CUDA_CHECK(
      cub::DeviceSegmentedReduce::Reduce(temp, bytes, in, out, count, begins, ends, combine, init, ctx.stream()));
}

namespace detail {
// Rows 0..n-1 for the sort's values; counts[0..n] zero for the scan past the last group.
struct GroupStartOp {
  std::int32_t* rows;
  std::int32_t* counts;
  std::size_t n;
  __device__ void operator()(std::size_t i) const {
    if (i < n) rows[i] = static_cast<std::int32_t>(i);
    counts[i] = 0;
  }
};

// CUB's temporary bytes for the sort, run-length encoding and scan of n keys
// (one region serves all three, in turn), asked once per device and size.
inline std::size_t group_cub_bytes(const Context<cuda>& ctx, int n) {
  thread_local std::map<std::pair<int, int>, std::size_t> known;
  const auto key = std::make_pair(ctx.device(), n);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  const std::int32_t* in = nullptr;
  std::int32_t* out = nullptr;
  std::size_t sort = 0, encode = 0, scan = 0;
  AMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort, in, out, in, out, n, 0, 32, ctx.stream()));
  AMP_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, encode, in, out, out, out, n, ctx.stream()));
  AMP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan, in, out, n + 1, ctx.stream()));
  return known[key] = std::max(sort, std::max(encode, scan));
}

// The int32 part of group_by_key's workspace: the rows 0..n-1, the sorted keys, n + 1 counts.
inline std::size_t group_int_bytes(std::size_t n) { return ((3 * n + 1) * sizeof(std::int32_t) + 255) / 256 * 256; }
}  // namespace detail

inline std::size_t group_by_key_bytes(Context<cuda>& ctx, std::size_t n) {
  AMP_REQUIRE(n < static_cast<std::size_t>(INT_MAX), "group_by_key: ", n, " rows do not fit int32 indices");
  return detail::group_int_bytes(n) + detail::group_cub_bytes(ctx, static_cast<int>(n));
}

// Groups rows by key (backend/groups.hpp): CUB's stable radix sort of (key,
// row) pairs, run-length encoding of the sorted keys, an exclusive scan of
// the run lengths; all on the stream, deterministic.
inline void group_by_key(Context<cuda>& ctx, const std::int32_t* keys, std::size_t n, KeyGroups out, void* temp) {
  const std::size_t bytes = group_by_key_bytes(ctx, n);
  ctx.activate();
  const int count = static_cast<int>(n);
  auto* rows = static_cast<std::int32_t*>(temp);
  std::int32_t* sorted = rows + n;
  std::int32_t* counts = sorted + n;
  void* cub_temp = static_cast<std::byte*>(temp) + detail::group_int_bytes(n);
  std::size_t cub_bytes = bytes - detail::group_int_bytes(n);
  for_each(ctx, n + 1, detail::GroupStartOp{rows, counts, n});
  ctx.count_launch();
  AMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_temp, cub_bytes, keys, sorted, rows, out.rows, count, 0, 32,
                                                 ctx.stream()));
  ctx.count_launch();
  AMP_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(cub_temp, cub_bytes, sorted, out.keys, counts, out.count, count,
                                                    ctx.stream()));
  ctx.count_launch();
  AMP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(cub_temp, cub_bytes, counts, out.offsets, count + 1, ctx.stream()));
}

}  // namespace amp
