#pragma once
// y = act(x W^T + b). The policy decides every type: the GEMM consumes
// compute_type<gemm> (O1 through the per-step cast cache), accumulates in fp32,
// and writes weight gradients straight in grad_type (fp32 under O1). Bias and
// activation run in the GEMM's epilogue, so y is rounded once; the bias
// gradient comes from the weight-gradient GEMM.
#include <cmath>
#include <type_traits>

#include "amp/backend/gemm.hpp"
#include "amp/core/activation.hpp"
#include "amp/nn/parameters.hpp"
#include "amp/tensor.hpp"

namespace amp::nn {

namespace detail {
// dz = act'(z) * dy: the activation's backward before the GEMMs' backward.
template <class Fn, class T>
struct ActivationGradOp {
  const T* pre;  // z (gelu) or nullptr
  const T* y;
  const T* dy;
  T* dz;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    dz[i] = cast<T>(Fn::backward(pre ? cast<float>(pre[i]) : 0.0f, cast<float>(y[i]), cast<float>(dy[i])));
  }
};
}  // namespace detail

// Unconstrained parameters, so the template passes as a template argument to
// Sequential; the constraints are checked inside.
template <class P, class B>
class Linear {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  using gemm_type = typename P::template compute_type<op::gemm>;
  using grad_type = typename P::grad_type;
  // cuBLAS and the host path write C in the input type or fp32.
  static_assert(std::is_same_v<T, gemm_type> || std::is_same_v<T, float>,
                "Linear: activation_type must be the GEMM compute type or fp32");
  static_assert(std::is_same_v<grad_type, gemm_type> || std::is_same_v<grad_type, float>,
                "Linear: grad_type must be the GEMM compute type or fp32");
  static constexpr bool casts_activations = !std::is_same_v<T, gemm_type>;

  struct Config {
    std::int64_t in_features = 0;
    std::int64_t out_features = 0;
    bool bias = true;
    activation act = activation::none;  // relu or gelu: fused into the GEMM
    initializer weight_init = initializer::kaiming_uniform;
  };

  Linear(Context<B>& ctx, const Config& cfg, std::int64_t max_batch, std::int64_t features, ParameterPlan& plan,
         bool need_dx)
      : cfg_(cfg), out_(ctx, {max_batch, cfg.out_features}, memory_kind::activations) {
    AMP_REQUIRE(cfg.in_features > 0 && cfg.out_features > 0, "Linear: features must be positive, got ",
                cfg.in_features, " -> ", cfg.out_features);
    AMP_REQUIRE(features == 0 || features == cfg.in_features, "Linear(", cfg.in_features, " -> ", cfg.out_features,
                "): the previous layer gives ", features, " features");
    weight_ = plan.add(static_cast<std::size_t>(cfg.out_features * cfg.in_features));
    if (cfg.bias) bias_ = plan.add(static_cast<std::size_t>(cfg.out_features));
    if (need_dx) dx_ = Tensor<T, B>(ctx, {max_batch, cfg.in_features}, memory_kind::activations);
    if (cfg.act != activation::none) dz_ = Tensor<T, B>(ctx, {max_batch, cfg.out_features}, memory_kind::activations);
    if (cfg.act == activation::gelu) z_ = Tensor<T, B>(ctx, {max_batch, cfg.out_features}, memory_kind::activations);
    if constexpr (casts_activations) {
      x_cast_ = Tensor<gemm_type, B>(ctx, {max_batch, cfg.in_features}, memory_kind::activations);
      dy_cast_ = Tensor<gemm_type, B>(ctx, {max_batch, cfg.out_features}, memory_kind::activations);
    }
  }

  std::int64_t out_features() const { return cfg_.out_features; }

  void init(Parameters<P, B>& params, std::uint64_t seed) {
    params.init_uniform(weight_, seed, init_bound(cfg_.weight_init, cfg_.in_features, cfg_.out_features));
    // PyTorch's bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    if (cfg_.bias) params.init_uniform(bias_, seed, 1.0f / std::sqrt(static_cast<float>(cfg_.in_features)));
  }

  ParamSlot weight_slot() const { return weight_; }
  ParamSlot bias_slot() const { return bias_; }

  Matrix<const T> forward(Context<B>& ctx, Parameters<P, B>& params, Matrix<const T> x) {
    x_ = as_gemm_input(ctx, x, x_cast_);
    const Matrix<T> y = out_.matrix().first_rows(x.rows);
    GemmEpilogue<T> ep{.act = cfg_.act};
    if (cfg_.bias) ep.bias = bias_values(params);
    if (cfg_.act == activation::gelu) ep.pre_activation = z_.data();
    gemm(ctx, x_, transpose::no, weight_matrix(params), transpose::yes, y, ep);
    return y;
  }

  // Accumulates dW and db (after zero_grad, a sum over micro-batches); returns dx.
  Matrix<const T> backward(Context<B>& ctx, Parameters<P, B>& params, Matrix<const T> dy) {
    Matrix<const T> dz = dy;
    if (cfg_.act != activation::none) {
      const Matrix<T> g = dz_.matrix().first_rows(dy.rows);
      const auto n = static_cast<std::size_t>(dy.size());
      if (cfg_.act == activation::relu)
        for_each(ctx, n, detail::ActivationGradOp<ReluFn, T>{nullptr, out_.data(), dy.data, g.data});
      else
        for_each(ctx, n, detail::ActivationGradOp<GeluFn, T>{z_.data(), out_.data(), dy.data, g.data});
      dz = g;
    }
    const Matrix<const gemm_type> dz_g = as_gemm_input(ctx, dz, dy_cast_);
    GemmEpilogue<grad_type> ep{.beta = 1.0f};
    if (cfg_.bias) ep.grad_bias = params.grads(bias_).data;
    gemm(ctx, dz_g, transpose::yes, x_, transpose::no, matrix(params.grads(weight_).data, cfg_.out_features, cfg_.in_features), ep);
    if (!dx_.data()) return {};
    const Matrix<T> dx = dx_.matrix().first_rows(dy.rows);
    gemm(ctx, dz_g, transpose::no, weight_matrix(params), transpose::no, dx);
    return dx;
  }

 private:
  // The bias in the output's type, as the epilogue adds it (O1: the cast cache).
  const T* bias_values(Parameters<P, B>& params) const {
    if constexpr (std::is_same_v<typename P::param_type, T>) return params.weights(bias_).data;
    else {
      static_assert(std::is_same_v<gemm_type, T>, "Linear: the bias is stored as the activation or GEMM type");
      return params.gemm_weights(bias_).data;
    }
  }

  Matrix<const gemm_type> weight_matrix(Parameters<P, B>& params) const {
    return {params.gemm_weights(weight_).data, cfg_.out_features, cfg_.in_features, cfg_.in_features};
  }

  static Matrix<const gemm_type> as_gemm_input(Context<B>& ctx, Matrix<const T> x, Tensor<gemm_type, B>& buffer) {
    if constexpr (casts_activations) {
      const Matrix<gemm_type> out = buffer.matrix().first_rows(x.rows);
      convert(ctx, Span<const T>(x.span()), out.span());
      return out;
    } else {
      (void)ctx;
      (void)buffer;
      return x;
    }
  }

  Config cfg_;
  ParamSlot weight_, bias_;
  Tensor<T, B> out_, dx_, dz_, z_;
  Tensor<gemm_type, B> x_cast_, dy_cast_;
  Matrix<const gemm_type> x_;
};

}  // namespace amp::nn
