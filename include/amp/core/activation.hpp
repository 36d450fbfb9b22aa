#pragma once
// Point-wise activation math, one AMP_HOST_DEVICE formula per function in fp32.
// Layers apply them element by element; GEMM epilogues fuse relu and gelu
// before the output's single rounding (as cuBLASLt's RELU/GELU epilogues do).
#include <cmath>
#include <cstdint>

#include "amp/core/macros.hpp"
#include "amp/core/numeric.hpp"

namespace amp {

namespace detail {
// e^x within 2 ulp for x in [-87, 88] (clamped outside), without calls or
// branches: a compiler vectorises it where the host's expf/tanhf are scalar
// library calls, and both backends run the same formula (Cephes' polynomial).
AMP_HOST_DEVICE inline float exp_poly(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);  // compares, not fminf/fmaxf: those stay library calls
  // n = round(x log2 e) by the 1.5 x 2^23 trick: floorf does not vectorise
  // (it must not raise "inexact"), and any nearby integer serves the reduction.
  const float magic = 12582912.0f;
  const float n = (x * 1.44269504088896341f + magic) - magic;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2, ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * bits_float(static_cast<std::uint32_t>(static_cast<int>(n) + 127) << 23);
}

// tanh(u) = 1 - 2 / (e^2u + 1): absolute error below 1e-7, which is what GELU's 1 + tanh needs.
AMP_HOST_DEVICE inline float tanh_poly(float u) { return 1.0f - 2.0f / (exp_poly(2.0f * u) + 1.0f); }
}  // namespace detail

// Activations a GEMM epilogue can fuse.
enum class activation { none, relu, gelu };

struct ReluFn {
  static constexpr bool backward_uses_input = false;
  AMP_HOST_DEVICE static float forward(float x) { return x > 0.0f ? x : 0.0f; }
  AMP_HOST_DEVICE static float backward(float, float y, float dy) { return y > 0.0f ? dy : 0.0f; }
};

struct TanhFn {
  static constexpr bool backward_uses_input = false;
  AMP_HOST_DEVICE static float forward(float x) { return tanhf(x); }
  AMP_HOST_DEVICE static float backward(float, float y, float dy) { return dy * (1.0f - y * y); }
};

struct SigmoidFn {
  static constexpr bool backward_uses_input = false;
  AMP_HOST_DEVICE static float forward(float x) { return 1.0f / (1.0f + expf(-x)); }
  AMP_HOST_DEVICE static float backward(float, float y, float dy) { return dy * y * (1.0f - y); }
};

// GELU, tanh form (PyTorch's approximate="tanh", cuBLASLt's GELU epilogue):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
struct GeluFn {
  static constexpr bool backward_uses_input = true;
  static constexpr float k = 0.7978845608028654f;  // sqrt(2/pi)
  static constexpr float c = 0.044715f;
  AMP_HOST_DEVICE static float forward(float x) { return 0.5f * x * (1.0f + detail::tanh_poly(k * (x + c * x * x * x))); }
  AMP_HOST_DEVICE static float backward(float x, float, float dy) {
    const float t = detail::tanh_poly(k * (x + c * x * x * x));
    return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x));
  }
};

AMP_HOST_DEVICE inline float apply(activation a, float x) {
  switch (a) {
    case activation::relu: return ReluFn::forward(x);
    case activation::gelu: return GeluFn::forward(x);
    default: return x;
  }
}

}  // namespace amp
