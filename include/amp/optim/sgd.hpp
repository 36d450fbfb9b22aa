#pragma once
// SGD with momentum, dampening, Nesterov and (L2) weight decay, as torch.optim.SGD.
#include "amp/optim/optimizer.hpp"

namespace amp::optim {

struct SGDOptions {
  float lr = 1e-3f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
};

struct SGDRule {
  static constexpr int state_buffers = 1;  // momentum
  static constexpr const char* name = "SGD";
  float momentum, dampening;
  bool nesterov;

  AMP_HOST_DEVICE float beta1_or_one() const { return 1.0f; }
  AMP_HOST_DEVICE float beta2_or_one() const { return 1.0f; }
  AMP_HOST_DEVICE float update(float w, float g, float* buf, float*, const StepValues& v, float lr, float wd) const {
    g += wd * w;
    if (momentum != 0.0f) {
      const float b = v.t == 1 ? g : momentum * *buf + (1.0f - dampening) * g;
      *buf = b;
      g = nesterov ? g + momentum * b : b;
    }
    return w - lr * g;
  }
};

template <Policy P, Backend B>
class SGD : public FusedOptimizer<P, B, SGDRule> {
 public:
  using Store = nn::ParameterStore<P, B>;
  SGD(Store& params, SGDOptions o, StepOptions step = {})
      : SGD(std::vector<Store*>{&params}, std::move(o), std::move(step)) {}
  // Several models in one optimizer.
  SGD(std::vector<Store*> params, SGDOptions o, StepOptions step = {})
      : FusedOptimizer<P, B, SGDRule>(std::move(params), rule(o), o.lr, o.weight_decay,
                                      std::move(step)) {}

 private:
  static SGDRule rule(const SGDOptions& o) {
    AMP_REQUIRE(o.momentum >= 0 && o.weight_decay >= 0, "SGD: momentum and weight_decay must be >= 0");
    AMP_REQUIRE(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
                "SGD: nesterov needs momentum > 0 and dampening 0");
    return {o.momentum, o.dampening, o.nesterov};
  }
};

}  // namespace amp::optim
