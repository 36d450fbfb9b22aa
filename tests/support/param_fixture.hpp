#pragma once
// A bare parameter block whose weights and (scaled) gradients a test sets by
// hand, to check optimizers and scalers against closed-form steps.
#include <memory>
#include <vector>

#include "amp/amp.hpp"

namespace amp::test {

template <Policy P, Backend B>
struct ParamFixture {
  using param_type = typename P::param_type;
  using grad_type = typename P::grad_type;

  Context<B>& ctx;
  nn::ParamSlot slot;
  std::unique_ptr<nn::Parameters<P, B>> params;

  ParamFixture(Context<B>& c, const std::vector<float>& w) : ctx(c) {
    nn::ParameterPlan plan;
    slot = plan.add(w.size());
    params = std::make_unique<nn::Parameters<P, B>>(ctx, plan);
    std::vector<param_type> stored(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) stored[i] = cast<param_type>(w[i]);
    upload(ctx, params->weights(slot), stored);
    if constexpr (nn::Parameters<P, B>::has_master) upload(ctx, params->master().subspan(0, w.size()), w);
  }

  void set_grads(const std::vector<float>& g) {
    std::vector<grad_type> stored(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) stored[i] = cast<grad_type>(g[i]);
    upload(ctx, params->grads(slot), stored);
  }
  // The fp32 values: master copy where there is one, else the weights.
  std::vector<float> values() const {
    if constexpr (nn::Parameters<P, B>::has_master) {
      auto m = download(ctx, Span<const float>(params->master()));
      m.resize(slot.count);
      return m;
    } else {
      const auto w = download(ctx, Span<const param_type>(params->weights(slot)));
      std::vector<float> out(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) out[i] = cast<float>(w[i]);
      return out;
    }
  }
  std::vector<param_type> weights() const { return download(ctx, Span<const param_type>(params->weights(slot))); }
};

}  // namespace amp::test
