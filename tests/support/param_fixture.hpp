#pragma once
// A bare parameter store holding one weight tensor whose values and (scaled)
// gradients a test sets by hand, to check optimizers and scalers against
// closed-form steps.
#include <memory>
#include <utility>
#include <vector>

#include "amp/amp.hpp"

namespace amp::test {

template <Policy P, Backend B>
struct ParamFixture {
  using param_type = typename P::param_type;
  using grad_type = typename P::grad_type;

  Context<B>& ctx;
  std::unique_ptr<nn::ParameterStore<P, B>> params;
  nn::Param<nn::role::weight> w;

  ParamFixture(Context<B>& c, const std::vector<float>& values) : ctx(c), params(std::make_unique<nn::ParameterStore<P, B>>(c)) {
    w = params->template declare<nn::role::weight>("w", {static_cast<std::int64_t>(values.size())}, nn::Init::constant(0.0f));
    params->allocate();
    params->set_values(w.index, values);
  }

  void set_grads(const std::vector<float>& g) {
    std::vector<grad_type> stored(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) stored[i] = cast<grad_type>(g[i]);
    upload(ctx, params->grads(w), stored);
  }
  std::vector<float> grads() const {
    const auto g = download(ctx, std::as_const(*params).grads(w));  // a read: not counted as a write
    std::vector<float> out(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) out[i] = cast<float>(g[i]);
    return out;
  }
  // The fp32 values: master copy where there is one, else the weights.
  std::vector<float> values() const { return params->get_values(w.index); }
  std::vector<param_type> weights() const { return download(ctx, Span<const param_type>(params->values(w))); }
};

// Gradients written by hand, declared as scaled by `scaler` (what scaler.scale(loss).backward() declares).
struct HandWrittenLoss {
  void backward(const float*) const {}
};
template <class Scaler>
void scaled_by_hand(Scaler& scaler) {
  HandWrittenLoss l;
  amp::ScaledLoss<HandWrittenLoss, Scaler>(l, scaler).backward();
}

}  // namespace amp::test
