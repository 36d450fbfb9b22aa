#pragma once
// Point-wise activations: one AMP_HOST_DEVICE formula per function, math in
// fp32, results stored in the policy's activation type.
#include <cmath>

#include "amp/nn/parameters.hpp"
#include "amp/tensor.hpp"

namespace amp::nn {

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

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
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

namespace detail {
template <class Fn, class T>
struct PointwiseForwardOp {
  const T* x;
  T* y;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { y[i] = cast<T>(Fn::forward(cast<float>(x[i]))); }
};

template <class Fn, class T>
struct PointwiseBackwardOp {
  const T* x;
  const T* y;
  const T* dy;
  T* dx;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    dx[i] = cast<T>(Fn::backward(x ? cast<float>(x[i]) : 0.0f, cast<float>(y[i]), cast<float>(dy[i])));
  }
};
}  // namespace detail

template <class P, class B, class Fn>
class Pointwise {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  struct Config {};

  Pointwise(Context<B>& ctx, const Config&, std::int64_t max_batch, std::int64_t features, ParameterPlan&,
            bool need_dx)
      : features_(features), out_(ctx, {max_batch, features}, memory_kind::activations) {
    AMP_REQUIRE(features > 0, "activation layer: no feature count to act on (a Linear must come first)");
    if (need_dx) dx_ = Tensor<T, B>(ctx, {max_batch, features}, memory_kind::activations);
  }

  std::int64_t out_features() const { return features_; }
  void init(Parameters<P, B>&, std::uint64_t) {}

  Matrix<const T> forward(Context<B>& ctx, Parameters<P, B>&, Matrix<const T> x) {
    input_ = x;
    const Matrix<T> y = out_.matrix().first_rows(x.rows);
    for_each(ctx, static_cast<std::size_t>(x.size()), detail::PointwiseForwardOp<Fn, T>{x.data, y.data});
    return y;
  }

  Matrix<const T> backward(Context<B>& ctx, Parameters<P, B>&, Matrix<const T> dy) {
    if (!dx_.data()) return {};
    const Matrix<T> dx = dx_.matrix().first_rows(dy.rows);
    const T* x = Fn::backward_uses_input ? input_.data : nullptr;
    for_each(ctx, static_cast<std::size_t>(dy.size()),
             detail::PointwiseBackwardOp<Fn, T>{x, out_.data(), dy.data, dx.data});
    return dx;
  }

 private:
  std::int64_t features_;
  Tensor<T, B> out_, dx_;
  Matrix<const T> input_;
};

template <class P, class B>
using ReLU = Pointwise<P, B, ReluFn>;
template <class P, class B>
using GELU = Pointwise<P, B, GeluFn>;
template <class P, class B>
using Tanh = Pointwise<P, B, TanhFn>;
template <class P, class B>
using Sigmoid = Pointwise<P, B, SigmoidFn>;

}  // namespace amp::nn
