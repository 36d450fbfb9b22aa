#pragma once
// Point-wise activation layers: the formulas of amp/core/activation.hpp, math
// in fp32, results stored in the policy's activation type. A Linear followed by
// relu or gelu fuses it instead (Linear::Config::act).
#include "amp/core/activation.hpp"

#include "amp/nn/parameters.hpp"
#include "amp/tensor.hpp"

namespace amp::nn {

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
