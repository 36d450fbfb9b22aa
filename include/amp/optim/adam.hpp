#pragma once
// Adam (L2 weight decay folded into the gradient) and AdamW (decoupled decay),
// as torch.optim.Adam / AdamW, defaults included; moments in fp32.
#include <optional>

#include "amp/optim/optimizer.hpp"

namespace amp::optim {

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  std::optional<float> weight_decay = std::nullopt;  // default: PyTorch's, 0 for Adam and 0.01 for AdamW
};

template <bool Decoupled>
struct AdamRule {
  static constexpr int state_buffers = 2;  // first and second moments
  static constexpr const char* name = Decoupled ? "AdamW" : "Adam";
  float beta1, beta2, eps;

  AMP_HOST_DEVICE float beta1_or_one() const { return beta1; }
  AMP_HOST_DEVICE float beta2_or_one() const { return beta2; }
  AMP_HOST_DEVICE float update(float w, float g, float* m, float* v, const StepValues& s, float lr, float wd) const {
    if (Decoupled) w -= lr * wd * w;
    else g += wd * w;
    const float m1 = beta1 * *m + (1.0f - beta1) * g;
    const float v1 = beta2 * *v + (1.0f - beta2) * g * g;
    *m = m1;
    *v = v1;
    const float bc1 = 1.0f - s.beta1_pow;  // s.beta*_pow already include this step
    const float bc2 = 1.0f - s.beta2_pow;
    return w - lr * (m1 / bc1) / (sqrtf(v1 / bc2) + eps);
  }
};

namespace detail {
template <bool Decoupled>
float weight_decay(const AdamOptions& o) {
  return o.weight_decay.value_or(Decoupled ? 0.01f : 0.0f);
}
template <bool Decoupled>
AdamRule<Decoupled> adam_rule(const AdamOptions& o, const char* name) {
  AMP_REQUIRE(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, name, ": betas must lie in [0, 1), got ", o.beta1,
              ", ", o.beta2);
  AMP_REQUIRE(o.eps > 0, name, ": eps must be > 0, got ", o.eps);
  AMP_REQUIRE(weight_decay<Decoupled>(o) >= 0, name, ": weight_decay must be >= 0, got ", weight_decay<Decoupled>(o));
  return {o.beta1, o.beta2, o.eps};
}
}  // namespace detail

template <Policy P, Backend B, bool Decoupled>
class AdamBase : public FusedOptimizer<P, B, AdamRule<Decoupled>> {
 public:
  using Store = nn::ParameterStore<P, B>;
  AdamBase(std::vector<Store*> params, const AdamOptions& o, StepOptions step)
      : FusedOptimizer<P, B, AdamRule<Decoupled>>(std::move(params),
                                                  detail::adam_rule<Decoupled>(o, Decoupled ? "AdamW" : "Adam"), o.lr,
                                                  detail::weight_decay<Decoupled>(o),
                                                  std::move(step)) {}
};

template <Policy P, Backend B>
class Adam : public AdamBase<P, B, false> {
 public:
  using Store = nn::ParameterStore<P, B>;
  Adam(Store& params, AdamOptions o = {}, StepOptions step = {})
      : AdamBase<P, B, false>({&params}, o, std::move(step)) {}
  Adam(std::vector<Store*> params, AdamOptions o = {}, StepOptions step = {})
      : AdamBase<P, B, false>(std::move(params), o, std::move(step)) {}
};

template <Policy P, Backend B>
class AdamW : public AdamBase<P, B, true> {
 public:
  using Store = nn::ParameterStore<P, B>;
  AdamW(Store& params, AdamOptions o = {}, StepOptions step = {})
      : AdamBase<P, B, true>({&params}, o, std::move(step)) {}
  AdamW(std::vector<Store*> params, AdamOptions o = {}, StepOptions step = {})
      : AdamBase<P, B, true>(std::move(params), o, std::move(step)) {}
};

}  // namespace amp::optim
