#pragma once
// Deterministic initialisation: a counter-based hash of (seed, index) gives the
// same uniform numbers on every backend and thread count, so a model starts
// from identical values on the CPU and the GPU.
#include <cmath>
#include <cstdint>

#include "amp/core/numeric.hpp"

namespace amp::nn {

enum class initializer { kaiming_uniform, xavier_uniform };

// Bound of the uniform distribution: Kaiming for ReLU nets (gain sqrt 2),
// Xavier (Glorot) for tanh/sigmoid nets.
inline float init_bound(initializer kind, std::int64_t fan_in, std::int64_t fan_out) {
  if (kind == initializer::xavier_uniform) return std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
  return std::sqrt(6.0f / static_cast<float>(fan_in));
}

namespace detail {
// A 64-bit mix (splitmix64's finaliser): well-spread bits from consecutive inputs.
AMP_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-bound, bound): 24 random bits make 2u - 1 exact, so the one
// rounding (the product) is the same on every backend.
AMP_HOST_DEVICE inline float uniform_symmetric(std::uint64_t seed, std::uint64_t index, float bound) {
  const std::uint64_t bits = mix64(seed * 0x9e3779b97f4a7c15ull + index + 1) >> 40;
  const float u = static_cast<float>(bits) * 5.9604644775390625e-8f;  // bits * 2^-24
  return bound * (2.0f * u - 1.0f);
}

// Writes the fp32 value to the master copy (when there is one) and its
// rounding to the stored weights.
template <class Param>
struct UniformInitOp {
  Param* weights;
  float* master;  // nullptr without master weights
  std::uint64_t seed;
  float bound;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const float x = uniform_symmetric(seed, i, bound);
    if (master) master[i] = x;
    weights[i] = cast<Param>(x);
  }
};
}  // namespace detail

}  // namespace amp::nn
