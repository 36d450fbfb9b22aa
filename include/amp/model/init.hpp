#pragma once
// Deterministic initialisation: a counter-based hash of (seed, index) gives the
// same numbers for any thread count, computed on the host (so the CPU's and
// the GPU's math libraries never differ), so a model starts from identical
// values on the CPU and the GPU.
#include <cmath>
#include <cstdint>

#include "amp/core/numeric.hpp"

namespace amp::nn {

// How a parameter starts: uniform in [-a, a), normal(0, a), or the constant a.
struct Init {
  enum class kind { uniform, normal, constant };
  kind k = kind::constant;
  float a = 0.0f;

  static Init uniform(float bound) { return {kind::uniform, bound}; }
  static Init normal(float stddev) { return {kind::normal, stddev}; }
  static Init constant(float value) { return {kind::constant, value}; }
  // He/Kaiming uniform for ReLU nets (gain sqrt 2): amp's default for weights.
  static Init kaiming_uniform(std::int64_t fan_in) { return uniform(std::sqrt(6.0f / static_cast<float>(fan_in))); }
  // Glorot/Xavier uniform, for tanh and sigmoid nets.
  static Init xavier_uniform(std::int64_t fan_in, std::int64_t fan_out) {
    return uniform(std::sqrt(6.0f / static_cast<float>(fan_in + fan_out)));
  }
  // PyTorch's default for Linear and Conv2d weights and biases alike:
  // kaiming_uniform with a = sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  static Init torch_default(std::int64_t fan_in) { return uniform(1.0f / std::sqrt(static_cast<float>(fan_in))); }
};

// Which weight initialisation a layer uses.
// gpt2: normal(0, 0.02) weights and zero biases, as GPT-2 and nanoGPT start.
enum class initializer { kaiming_uniform, xavier_uniform, torch_default, gpt2 };

inline Init weight_init(initializer kind, std::int64_t fan_in, std::int64_t fan_out) {
  switch (kind) {
    case initializer::xavier_uniform: return Init::xavier_uniform(fan_in, fan_out);
    case initializer::torch_default: return Init::torch_default(fan_in);
    case initializer::gpt2: return Init::normal(0.02f);
    default: return Init::kaiming_uniform(fan_in);
  }
}

// A 64-bit mix (splitmix64's finaliser): well-spread bits from consecutive
// inputs. amp draws every random number with it; a program that replays an
// order (the examples' training windows) may too.
AMP_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace detail {
// 24 random bits as a float in [0, 1): exact, so the same on every backend.
AMP_HOST_DEVICE inline float unit_uniform(std::uint64_t seed, std::uint64_t index) {
  const std::uint64_t bits = mix64(seed * 0x9e3779b97f4a7c15ull + index + 1) >> 40;
  return static_cast<float>(bits) * 5.9604644775390625e-8f;  // bits * 2^-24
}

// An op's random stream (dropout), keyed on the device: the forward counter
// is read there when the op runs, so a replayed CUDA graph draws new masks
// every step, the same bits as eager steps on every backend.
struct RandomStream {
  const std::uint64_t* forwards = nullptr;  // backend memory: forwards run so far
  std::uint64_t seed = 0, op = 0;
  AMP_HOST_DEVICE std::uint64_t key() const { return mix64(seed ^ mix64(*forwards * 1024 + op)); }
};

// The value of element `index` of a parameter initialised by `init`.
inline float init_value(Init init, std::uint64_t seed, std::uint64_t index) {
  if (init.k == Init::kind::constant) return init.a;
  const float u = unit_uniform(seed, index);
  if (init.k == Init::kind::uniform) return init.a * (2.0f * u - 1.0f);
  // Box-Muller from two independent uniforms; u1 in (0, 1] so the log is finite.
  const float u1 = 1.0f - u, u2 = unit_uniform(seed ^ 0x5bd1e995ull, index);
  return init.a * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.283185307179586f * u2);
}

}  // namespace detail

}  // namespace amp::nn
