#pragma once
// ZeRO stage 1's partition: which elements of each role's flat arena a rank
// keeps the fp32 masters and optimizer state of. Pure arithmetic on offsets,
// the same on every rank (ParameterStore holds the result).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace amp::nn {

// Which part of the masters and optimizer state this process keeps (ZeRO
// stage 1): rank `rank` of `ranks`. The default keeps everything.
struct Shard {
  int rank = 0;
  int ranks = 1;
  // Cut only where a tensor starts (LAMB's per-tensor norms need whole
  // tensors), as near to even as the tensors allow; else evenly, through tensors.
  bool whole_tensors = false;
};

// Elements [begin, end) of one parameter.
struct Part {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};

// The shards of an arena of `count` elements (a multiple of `block`) whose
// tensors start at `starts` (ascending): rank r keeps [bounds[r], bounds[r + 1]),
// cut at r x count / ranks rounded down to a block, or at the tensor start nearest to it.
inline std::vector<std::size_t> shard_bounds(const std::vector<std::size_t>& starts, std::size_t count, int ranks,
                                             bool whole_tensors, std::size_t block) {
  std::vector<std::size_t> bounds{0};
  for (int r = 1; r < ranks; ++r) {
    if (!whole_tensors) {
      bounds.push_back(count / block * static_cast<std::size_t>(r) / static_cast<std::size_t>(ranks) * block);
      continue;
    }
    const double target = static_cast<double>(count) * r / ranks;
    std::size_t best = count;
    for (std::size_t s : starts)
      if (s >= bounds.back() && std::abs(static_cast<double>(s) - target) < std::abs(static_cast<double>(best) - target))
        best = s;
    bounds.push_back(best);
  }
  bounds.push_back(count);
  return bounds;
}

// The elements of a tensor at [offset, offset + count) in rank r's shard.
inline Part part_in_shard(std::size_t offset, std::size_t count, const std::vector<std::size_t>& bounds, int r) {
  const std::size_t lo = std::max(offset, bounds[static_cast<std::size_t>(r)]);
  const std::size_t hi = std::min(offset + count, bounds[static_cast<std::size_t>(r) + 1]);
  return lo < hi ? Part{lo - offset, hi - offset} : Part{};
}

}  // namespace amp::nn
