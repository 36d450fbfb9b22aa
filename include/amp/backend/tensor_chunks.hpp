#pragma once
// Tensors laid out in one flat buffer (a parameter arena), cut into chunks of
// at most 65536 elements, for a reduction per tensor in two launches however
// many tensors: every chunk at once (on the GPU CUB's segmented reduction, a
// block per chunk, so a large tensor spreads over the GPU; on the CPU a thread
// per chunk), then each tensor's chunks in order. Deterministic: the chunks
// depend on the sizes alone.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/core/error.hpp"

namespace amp {

namespace detail {
inline constexpr std::size_t tensor_chunk_elements = std::size_t{1} << 16;

// Tensor t's value: its chunks' combined in order.
template <class T, class Combine>
struct CombineChunksOp {
  const T* chunks;
  const std::uint32_t* first;  // tensor t's chunks: [first[t], first[t + 1])
  T* out;
  Combine combine;
  T init;
  AMP_HOST_DEVICE void operator()(std::size_t t) const {
    T s = init;
    for (std::uint32_t k = first[t]; k < first[t + 1]; ++k) s = combine(s, chunks[k]);
    out[t] = s;
  }
};
}  // namespace detail

template <Backend B>
class TensorChunks {
 public:
  TensorChunks() = default;
  // Tensor t is elements [offsets[t], offsets[t] + counts[t]) of the span a reduction reads.
  TensorChunks(Context<B>& ctx, const std::vector<std::size_t>& offsets, const std::vector<std::size_t>& counts)
      : tensors_(offsets.size()) {
    AMP_REQUIRE(offsets.size() == counts.size(), "TensorChunks: ", offsets.size(), " offsets and ", counts.size(),
                " counts");
    std::vector<std::size_t> begins, ends;
    std::vector<std::uint32_t> first{0};
    for (std::size_t t = 0; t < tensors_; ++t) {
      for (std::size_t at = 0; at < counts[t]; at += detail::tensor_chunk_elements) {
        begins.push_back(offsets[t] + at);
        ends.push_back(offsets[t] + std::min(counts[t], at + detail::tensor_chunk_elements));
        owner_.push_back(static_cast<std::uint32_t>(t));
      }
      first.push_back(static_cast<std::uint32_t>(begins.size()));
    }
    chunks_ = begins.size();
    begins.insert(begins.end(), ends.begin(), ends.end());
    bounds_ = Buffer<std::size_t, B>(ctx, begins.size(), memory_kind::optimizer);
    upload(ctx, bounds_.span(), begins);
    first_ = Buffer<std::uint32_t, B>(ctx, first.size(), memory_kind::optimizer);
    upload(ctx, first_.span(), first);
  }

  std::size_t tensors() const { return tensors_; }
  std::size_t chunks() const { return chunks_; }
  // Which tensor each chunk belongs to (host memory).
  const std::vector<std::uint32_t>& owners() const { return owner_; }

  // per_chunk[k] = combine over chunk k's elements of map(i) (chunks()
  // elements of backend memory); per_tensor[t] = tensor t's chunks combined
  // (nullptr: not wanted). Nothing at all without tensors.
  template <class T, class Map, class Combine>
  void reduce(Context<B>& ctx, Map map, Combine combine, T init, T* per_chunk, T* per_tensor) const {
    if (tensors_ == 0) return;
    const std::size_t* begins = bounds_.data();
    segmented_transform_reduce(ctx, chunks_, begins, begins + chunks_, map, combine, init, per_chunk);
    if (per_tensor)
      for_each(ctx, tensors_, detail::CombineChunksOp<T, Combine>{per_chunk, first_.data(), per_tensor, combine, init});
  }

 private:
  std::size_t tensors_ = 0, chunks_ = 0;
  std::vector<std::uint32_t> owner_;
  Buffer<std::size_t, B> bounds_;   // the chunks' begins, then their ends
  Buffer<std::uint32_t, B> first_;  // per tensor, then one past the last
};

}  // namespace amp
