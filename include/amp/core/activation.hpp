#pragma once
// Point-wise activation math, one AMP_HOST_DEVICE formula per function in fp32.
// Layers apply them element by element; GEMM epilogues fuse relu and gelu
// before the output's single rounding (as cuBLASLt's RELU/GELU epilogues do).
#include <cmath>

#include "amp/core/macros.hpp"

namespace amp {

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
  AMP_HOST_DEVICE static float forward(float x) { return 0.5f * x * (1.0f + tanhf(k * (x + c * x * x * x))); }
  AMP_HOST_DEVICE static float backward(float x, float, float dy) {
    const float t = tanhf(k * (x + c * x * x * x));
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
