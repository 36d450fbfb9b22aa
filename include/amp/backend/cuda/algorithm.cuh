#pragma once
// GPU launches of the shared functors: a grid-stride for_each kernel and CUB's
// transform-reduce over a counting iterator (the map takes an index), both on the context's stream, writing results to device memory.
#include <map>
#include <utility>

#include <cub/device/device_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "amp/backend/cuda/context.cuh"

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

}  // namespace amp
