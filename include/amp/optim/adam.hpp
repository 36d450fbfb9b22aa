#pragma once
// Adam (L2 weight decay folded into the gradient) and AdamW (decoupled decay),
// as torch.optim.Adam / AdamW; moments in fp32.
#include "amp/optim/optimizer.hpp"

namespace amp::optim {

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float max_grad_norm = 0.0f;
  int accumulation_steps = 1;
};

template <bool Decoupled>
struct AdamRule {
  static constexpr int state_buffers = 2;  // first and second moments
  float beta1, beta2, eps, weight_decay;

  AMP_HOST_DEVICE float beta1_or_one() const { return beta1; }
  AMP_HOST_DEVICE float beta2_or_one() const { return beta2; }
  AMP_HOST_DEVICE float update(float w, float g, float* m, float* v, const OptimizerState& s, float lr) const {
    if (Decoupled) w -= lr * weight_decay * w;
    else g += weight_decay * w;
    const float m1 = beta1 * *m + (1.0f - beta1) * g;
    const float v1 = beta2 * *v + (1.0f - beta2) * g * g;
    *m = m1;
    *v = v1;
    const float bc1 = 1.0f - s.beta1_pow * beta1;  // this step is number t + 1
    const float bc2 = 1.0f - s.beta2_pow * beta2;
    return w - lr * (m1 / bc1) / (sqrtf(v1 / bc2) + eps);
  }
};

namespace detail {
template <bool Decoupled>
AdamRule<Decoupled> adam_rule(const AdamOptions& o, const char* name) {
  AMP_REQUIRE(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, name, ": betas must lie in [0, 1), got ",
              o.beta1, ", ", o.beta2);
  AMP_REQUIRE(o.eps > 0 && o.weight_decay >= 0, name, ": need eps > 0 and weight_decay >= 0");
  return {o.beta1, o.beta2, o.eps, o.weight_decay};
}
}  // namespace detail

template <Policy P, Backend B>
class Adam : public FusedOptimizer<P, B, AdamRule<false>> {
 public:
  Adam(nn::Parameters<P, B>& params, AdamOptions o, ScalerConfig scaler = default_scaler_config<P>())
      : FusedOptimizer<P, B, AdamRule<false>>(params, detail::adam_rule<false>(o, "Adam"), o.lr,
                                              {o.max_grad_norm, o.accumulation_steps}, scaler) {}
};

template <Policy P, Backend B>
class AdamW : public FusedOptimizer<P, B, AdamRule<true>> {
 public:
  // PyTorch's AdamW default decay is 0.01.
  AdamW(nn::Parameters<P, B>& params, AdamOptions o = {.weight_decay = 0.01f},
        ScalerConfig scaler = default_scaler_config<P>())
      : FusedOptimizer<P, B, AdamRule<true>>(params, detail::adam_rule<true>(o, "AdamW"), o.lr,
                                             {o.max_grad_norm, o.accumulation_steps}, scaler) {}
};

}  // namespace amp::optim
