#pragma once
// Point-wise activation layers: the formulas of amp/core/activation.hpp, math
// in fp32, rounded through compute_type<pointwise>, stored as activation_type.
// A Linear or Conv2d followed by relu or gelu fuses it instead (Config::act).
#include "amp/core/activation.hpp"
#include "amp/model/model.hpp"
#include "amp/nn/ops.hpp"

namespace amp::nn {

template <Policy P, Backend B, class Fn>
Var<typename P::activation_type> apply_activation(Graph<P, B>& g, Var<typename P::activation_type> x) {
  using T = typename P::activation_type;
  using C = typename P::template compute_type<op::pointwise>;
  g.require_current(x, "activation");
  Var<T> y = g.template tensor<T>(x.shape);
  for_each(g.context(), x.size(), detail::ActivationOp<Fn, C, T>{x.data, y.data});
  g.on_backward([=](Graph<P, B>& gb) {
    const T* dy = gb.grad(y);
    if (!dy) return;  // no gradient reached y: claim no slot for x
    const GradOut<T> dx = gb.grad_out(x);
    if (!dy || !dx) return;
    const T* in = Fn::backward_uses_input ? x.data : nullptr;
    for_each(gb.context(), x.size(), detail::ActivationGradOp<Fn, C, T>{in, y.data, dy, dx.data, dx.accumulate});
  });
  return y;
}

template <class P, class B, class Fn>
class Activation {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  struct Config {};
  static int torch_slots(const Config&) { return 1; }

  Activation(Builder<P, B>, const Config&) {}
  Var<T> operator()(Graph<P, B>& g, Var<T> x) const { return apply_activation<P, B, Fn>(g, x); }
};

template <class P, class B>
using ReLU = Activation<P, B, ReluFn>;
template <class P, class B>
using GELU = Activation<P, B, GeluFn>;
template <class P, class B>
using Tanh = Activation<P, B, TanhFn>;
template <class P, class B>
using Sigmoid = Activation<P, B, SigmoidFn>;

// The functional forms, for nets that call them inline.
template <Policy P, Backend B>
Var<typename P::activation_type> relu(Graph<P, B>& g, Var<typename P::activation_type> x) {
  return apply_activation<P, B, ReluFn>(g, x);
}
template <Policy P, Backend B>
Var<typename P::activation_type> gelu(Graph<P, B>& g, Var<typename P::activation_type> x) {
  return apply_activation<P, B, GeluFn>(g, x);
}

}  // namespace amp::nn
