#pragma once
// A model's parameters as the data-parallel tests compare them: every value as
// fp32 (masters where there are some), and a hash of bytes to tell ranks apart.
#include <cstdint>
#include <vector>

namespace amp::test {

template <class Store>
std::vector<float> values_of(const Store& s) {
  std::vector<float> out;
  for (std::size_t i = 0; i < s.table().size(); ++i) {
    const auto v = s.get_values(static_cast<int>(i));
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// FNV-1a over bytes, continued from h.
inline std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  return h;
}

}  // namespace amp::test
