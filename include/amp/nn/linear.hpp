#pragma once
// Linear: y = act(x W^T + b) over the last dimension. The policy decides every
// type: the GEMM consumes compute_type<gemm> (O1 through the per-step cast
// cache), accumulates in fp32, adds the bias and applies relu/gelu in its
// epilogue and rounds y once; weight gradients land in grad_type (fp32 under
// O1), the bias gradient comes from the weight-gradient GEMM.
// Under an FP8 policy (unless kept out as a first or last layer) its three
// GEMMs take FP8 codes: x and W in the forward format, dy in the backward
// one, each cast with its scale (model/fp8_state.hpp) into the layout the
// FP8 GEMM takes (both operands K-major), the bias gradient summed from dy
// before quantisation.
// Its policy may be a layer policy (amp::KeepFp32<P>, amp::NoFp8<P>) in a
// model of policy P: it takes and returns P's activations, converted at its
// boundary, and computes and keeps its weights as its own policy says.
#include <string>
#include <type_traits>

#include "amp/backend/gemm.hpp"
#include "amp/core/activation.hpp"
#include "amp/core/fp8.hpp"
#include "amp/model/model.hpp"
#include "amp/model/numerics_sites.hpp"
#include "amp/nn/ops.hpp"
#include "amp/model/graph_hooks.hpp"

namespace amp::nn {

// Unconstrained parameters, so the template passes as a template argument to
// Sequential; the constraints are checked inside.
template <class Q, class B>
class Linear {
  static_assert(Policy<Q> && Backend<B>);

 public:
  using P = model_policy_t<Q>;             // the model's: its graph, store and activations
  using X = typename P::activation_type;   // what comes in and goes out
  using T = typename Q::activation_type;   // what the layer computes between its boundary casts
  using G = typename Q::template compute_type<op::gemm>;
  using GW = typename Q::grad_type;
  static constexpr role R = weight_role_v<Q>;
  using Fp8 = fp8_config_t<Q>;  // used only when uses_fp8_v<Q>
  using Fx = typename Fp8::forward_type;
  using Fg = typename Fp8::backward_type;
  static_assert(std::is_same_v<T, G> || std::is_same_v<T, float>,
                "Linear: activation_type must be the GEMM compute type or fp32");
  static_assert(std::is_same_v<GW, G> || std::is_same_v<GW, float>,
                "Linear: grad_type must be the GEMM compute type or fp32");
  static_assert(R == role::weight || (std::is_same_v<typename Q::param_type, float> && std::is_same_v<GW, float>),
                "Linear: a layer policy stores its weights as its model's policy does, or in fp32 (amp::KeepFp32)");
  static_assert(!uses_fp8_v<Q> || std::is_same_v<Fp8, fp8_config_t<P>>,
                "Linear: a layer in FP8 takes its model's FP8 recipe");

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
    spec_.weight = b.template param<R>("weight", {cfg.out_features, cfg.in_features},
                                       weight_init(cfg.init, cfg.in_features, cfg.out_features));
    if (cfg.bias) {
      // PyTorch's bias init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), but for gpt2's zeros; no weight decay.
      const Init bias_init =
          cfg.init == initializer::gpt2 ? Init::constant(0.0f) : Init::torch_default(cfg.in_features);
      spec_.bias = b.template param<R>("bias", {cfg.out_features}, bias_init, false);
    }
    if constexpr (uses_fp8_v<Q>)
      spec_.fp8 = b.store().fp8().declare(spec_.weight.index, name_.empty() ? "linear" : name_.substr(0, name_.size() - 1),
                                          cfg.out_features, cfg.in_features);
  }

  Var<X> operator()(Graph<P, B>& g, Var<X> x) const {
    g.require_current(x, "Linear '", name_, "'");
    AMP_REQUIRE(x.shape.rank() >= 1 && x.cols() == spec_.in, "Linear '", name_, "' (", spec_.in, " -> ", spec_.out,
                "): input ", x.shape.str(), " does not end in ", spec_.in, " features");
    g.params().visit_layer(spec_.weight.index);  // a layer out of FP8 keeps its place in the order
    const Var<T> xt = to_type<T>(g, x);
    const auto run = [&] {
      if constexpr (uses_fp8_v<Q>)
        if (g.params().fp8().enabled(spec_.fp8)) return forward_fp8(g, spec_, xt);
      return forward(g, spec_, xt);
    };
    const Var<X> y = to_type<X>(g, run());
    observe_layer(g, y, name_, "linear");
    return y;
  }

  Param<R> weight() const { return spec_.weight; }
  Param<R> bias() const { return spec_.bias; }
  std::int64_t in_features() const { return spec_.in; }
  std::int64_t out_features() const { return spec_.out; }

 private:
  // What forward and backward need: small and copyable into the closure.
  struct Spec {
    std::int64_t in = 0, out = 0;
    activation act = activation::none;
    bool has_bias = false;
    Param<R> weight, bias;
    int fp8 = -1;
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
    if (s.act == activation::none) detail::GraphHooks::allow_overwrite(g, y);  // its backward reads dy only: a fused loss may reuse y
    return y;
  }

  static void backward(Graph<P, B>& g, const Spec& s, Var<T> x, Matrix<const G> xg, Var<T> y, const T* pre) {
    const T* dy = g.grad(y);
    if (!dy) return;
    auto& ctx = g.context();
    const std::int64_t rows = y.rows();
    const GradOut<T> dx = g.grad_out(x);  // before the temporaries below
    Temporaries<P, B> temp(g);
    const T* dz = through_activation<Q>(g, s.act, y, pre, dy);
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

  // FP8: y = act(x W^T + b) from x's and W's codes. Backward keeps the codes
  // of x^T (the weight gradient's operand) and reads W^T's from the cache.
  static Var<T> forward_fp8(Graph<P, B>& g, const Spec& s, Var<T> x) {
    auto& ctx = g.context();
    auto& state = g.params().fp8();
    const std::int64_t rows = x.rows();
    const bool record = g.training() && !g.planning() && !g.replaying();
    Var<T> y = g.template tensor<T>(x.shape.with(-1, s.out));
    T* pre = s.act == activation::gelu ? g.template scratch<T>(y.size()) : nullptr;
    Fx* xt = g.template scratch<Fx>(x.size());
    const auto w = state.weights(s.fp8, g.params().values(s.weight).data, record);
    const Fp8Meta in = state.meta(s.fp8, fp8_operand::input), wm = state.meta(s.fp8, fp8_operand::weight);
    GemmEpilogue<T> ep{.act = s.act, .pre_activation = pre};
    if (s.has_bias) ep.bias = g.params().template as<T>(s.bias).data;
    {
      Temporaries<P, B> temp(g);  // x's codes serve this GEMM only
      Fx* x8 = g.template scratch<Fx>(x.size());
      fp8_cast<typename Fp8::recipe>(ctx, x.data, rows, s.in, x8, xt, in, record);
      gemm_fp8(ctx, Fp8Matrix<Fx>{{x8, rows, s.in, s.in}, in.scale_inv},
               Fp8Matrix<Fx>{{w.codes, s.out, s.in, s.in}, wm.scale_inv}, y.matrix(), ep);
    }
    g.on_backward([=](Graph<P, B>& gb) { backward_fp8(gb, s, x, xt, w.transposed, y, pre); });
    if (s.act == activation::none) detail::GraphHooks::allow_overwrite(g, y);
    return y;
  }

  static void backward_fp8(Graph<P, B>& g, const Spec& s, Var<T> x, const Fx* xt, const Fx* wt, Var<T> y,
                           const T* pre) {
    const T* dy = g.grad(y);
    if (!dy) return;
    auto& ctx = g.context();
    auto& params = g.params();
    auto& state = params.fp8();
    const std::int64_t rows = y.rows();
    const GradOut<T> dx = g.grad_out(x);  // before the temporaries below
    Temporaries<P, B> temp(g);
    const T* dz = through_activation<Q>(g, s.act, y, pre, dy);
    const Fp8Meta gm = state.meta(s.fp8, fp8_operand::grad), in = state.meta(s.fp8, fp8_operand::input),
                  wm = state.meta(s.fp8, fp8_operand::weight);
    Fg* dz8 = g.template scratch<Fg>(y.size());
    Fg* dzt = g.template scratch<Fg>(y.size());
    fp8_cast<typename Fp8::recipe>(ctx, dz, rows, s.out, dz8, dzt, gm, !g.planning());
    if (s.has_bias) {  // from dz itself: E5M2's two mantissa bits would round every term of the sum
      float* sums = g.template scratch<float>(static_cast<std::size_t>(s.out));
      column_sums(g, rows, s.out, detail::ValueAt<T>{dz, s.out}, sums);
      for_each(ctx, static_cast<std::size_t>(s.out), detail::AddGradFromFloatOp<GW>{sums, params.backward_grads(s.bias).data});
    }
    // dW += dz^T x: [out x rows] by [in x rows]^T; dx (+)= dz W: [rows x out] by [in x out]^T.
    gemm_fp8(ctx, Fp8Matrix<Fg>{{dzt, s.out, rows, rows}, gm.scale_inv}, Fp8Matrix<Fx>{{xt, s.in, rows, rows}, in.scale_inv},
             matrix(params.backward_grads(s.weight).data, s.out, s.in), GemmEpilogue<GW>{.beta = 1.0f});
    if (dx)
      gemm_fp8(ctx, Fp8Matrix<Fg>{{dz8, rows, s.out, s.out}, gm.scale_inv}, Fp8Matrix<Fx>{{wt, s.in, s.out, s.out}, wm.scale_inv},
               matrix(dx.data, rows, s.in), GemmEpilogue<T>{.beta = dx.accumulate ? 1.0f : 0.0f});
  }

  static Matrix<const G> weight_matrix(Graph<P, B>& g, const Spec& s) {
    return {g.params().template as<G>(s.weight).data, s.out, s.in, s.in};
  }

  std::string name_;
  Spec spec_;
};

}  // namespace amp::nn
