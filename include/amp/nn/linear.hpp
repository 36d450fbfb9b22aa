#pragma once
// Linear: y = act(x W^T + b) over the last dimension. The policy decides every
// type: the GEMM consumes compute_type<gemm> (O1 through the per-step cast
// cache), accumulates in fp32, adds the bias and applies relu/gelu in its
// epilogue and rounds y once; weight gradients land in grad_type (fp32 under
// O1), the bias gradient comes from the weight-gradient GEMM.
#include <string>
#include <type_traits>

#include "amp/backend/gemm.hpp"
#include "amp/core/activation.hpp"
#include "amp/model/model.hpp"
#include "amp/nn/ops.hpp"

namespace amp::nn {

// Unconstrained parameters, so the template passes as a template argument to
// Sequential; the constraints are checked inside.
template <class P, class B>
class Linear {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  using G = typename P::template compute_type<op::gemm>;
  using W = typename P::param_type;
  using GW = typename P::grad_type;
  static_assert(std::is_same_v<T, G> || std::is_same_v<T, float>,
                "Linear: activation_type must be the GEMM compute type or fp32");
  static_assert(std::is_same_v<GW, G> || std::is_same_v<GW, float>,
                "Linear: grad_type must be the GEMM compute type or fp32");

  struct Config {
    std::int64_t in_features = 0;
    std::int64_t out_features = 0;
    bool bias = true;
    activation act = activation::none;  // relu or gelu: fused into the GEMM
    initializer init = initializer::kaiming_uniform;
  };
  // Modules of an equivalent torch.nn.Sequential: Linear, and the activation when fused.
  static int torch_slots(const Config& c) { return c.act == activation::none ? 1 : 2; }

  Linear(Builder<P, B> b, const Config& cfg) : name_(b.prefix()) {
    AMP_REQUIRE(cfg.in_features > 0 && cfg.out_features > 0, "Linear '", name_, "': features must be positive, got ",
                cfg.in_features, " -> ", cfg.out_features);
    spec_.in = cfg.in_features, spec_.out = cfg.out_features, spec_.act = cfg.act, spec_.has_bias = cfg.bias;
    spec_.weight = b.template param<role::weight>("weight", {cfg.out_features, cfg.in_features},
                                                  weight_init(cfg.init, cfg.in_features, cfg.out_features));
    if (cfg.bias) {
      // PyTorch's bias init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), but for gpt2's zeros; no weight decay.
      const Init bias_init =
          cfg.init == initializer::gpt2 ? Init::constant(0.0f) : Init::torch_default(cfg.in_features);
      spec_.bias = b.template param<role::weight>("bias", {cfg.out_features}, bias_init, false);
    }
  }

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, "Linear '", name_, "'");
    AMP_REQUIRE(x.shape.rank() >= 1 && x.cols() == spec_.in, "Linear '", name_, "' (", spec_.in, " -> ", spec_.out,
                "): input ", x.shape.str(), " does not end in ", spec_.in, " features");
    return forward(g, spec_, x);
  }

  Param<role::weight> weight() const { return spec_.weight; }
  Param<role::weight> bias() const { return spec_.bias; }
  std::int64_t in_features() const { return spec_.in; }
  std::int64_t out_features() const { return spec_.out; }

 private:
  // What forward and backward need: small and copyable into the closure.
  struct Spec {
    std::int64_t in = 0, out = 0;
    activation act = activation::none;
    bool has_bias = false;
    Param<role::weight> weight, bias;
  };

  static Var<T> forward(Graph<P, B>& g, const Spec& s, Var<T> x) {
    const std::int64_t rows = x.rows();
    Var<T> y = g.template tensor<T>(x.shape.with(-1, s.out));
    const Matrix<const G> xg(as_type<G>(g, x.data, x.size()), rows, s.in, s.in);
    T* pre = s.act == activation::gelu ? g.template scratch<T>(y.size()) : nullptr;
    GemmEpilogue<T> ep{.act = s.act, .pre_activation = pre};
    if (s.has_bias) ep.bias = g.params().template as<T>(s.bias).data;
    gemm(g.context(), xg, transpose::no, weight_matrix(g, s), transpose::yes, y.matrix(), ep);
    g.on_backward([=](Graph<P, B>& gb) { backward(gb, s, x, xg, y, pre); });
    if (s.act == activation::none) g.allow_overwrite(y);  // its backward reads dy only: a fused loss may reuse y
    return y;
  }

  static void backward(Graph<P, B>& g, const Spec& s, Var<T> x, Matrix<const G> xg, Var<T> y, const T* pre) {
    const T* dy = g.grad(y);
    if (!dy) return;
    auto& ctx = g.context();
    const std::int64_t rows = y.rows();
    const GradOut<T> dx = g.grad_out(x);  // before the temporaries below
    Temporaries<P, B> temp(g);
    const T* dz = dy;
    if (s.act != activation::none) {  // through the activation first
      T* buf = g.template scratch<T>(y.size());
      using C = typename P::template compute_type<op::pointwise>;
      if (s.act == activation::relu)
        for_each(ctx, y.size(), detail::ActivationGradOp<ReluFn, C, T>{nullptr, y.data, dy, buf, false});
      else
        for_each(ctx, y.size(), detail::ActivationGradOp<GeluFn, C, T>{pre, y.data, dy, buf, false});
      dz = buf;
    }
    const Matrix<const G> dzg(as_type<G>(g, dz, y.size()), rows, s.out, s.out);
    auto& params = g.params();
    GemmEpilogue<GW> ep{.beta = 1.0f};  // parameter gradients accumulate (micro-batches, shared weights)
    if (s.has_bias) ep.grad_bias = params.backward_grads(s.bias).data;
    gemm(ctx, dzg, transpose::yes, xg, transpose::no, matrix(params.backward_grads(s.weight).data, s.out, s.in), ep);
    if (dx) {
      gemm(ctx, dzg, transpose::no, weight_matrix(g, s), transpose::no, matrix(dx.data, rows, s.in),
           GemmEpilogue<T>{.beta = dx.accumulate ? 1.0f : 0.0f});
    }
  }

  static Matrix<const G> weight_matrix(Graph<P, B>& g, const Spec& s) {
    return {g.params().template as<G>(s.weight).data, s.out, s.in, s.in};
  }

  std::string name_;
  Spec spec_;
};

}  // namespace amp::nn
