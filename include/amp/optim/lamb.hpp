#pragma once
// LAMB, as Apex's FusedLAMB computes it (You et al., "Large Batch Optimization
// for Deep Learning"): an Adam direction per element,
//   u = (m / bc1) / (sqrt(v / bc2) + eps) + wd x        (adam_w_mode; else wd x joins g)
// and per tensor a trust ratio that sets its step size,
//   x -= lr * (|x| / |u|) * u                          (|x| or |u| zero: lr * u)
// taken where the tensor's weight decay is not zero (or with use_nvlamb: always).
// The gradients are pre-normalised by their global norm: divided by
// |g| / max_grad_norm when that exceeds 1 (Apex's default max_grad_norm 1).
// Moments in fp32; the fp32 master (or fp32 weights) is the x of |x|.
#include "amp/optim/optimizer.hpp"

namespace amp::optim {

struct LambOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-6f;
  float weight_decay = 0.01f;
  bool bias_correction = true;
  bool grad_averaging = true;  // m takes (1 - beta1) g; false: g
  bool adam_w_mode = true;     // decoupled decay (in the direction); false: L2 (into the gradient)
  bool use_nvlamb = false;     // the trust ratio for tensors without weight decay too
  float max_grad_norm = 1.0f;  // the global pre-normalisation (the step's clipping); 0: none
};

struct LambRule {
  static constexpr int state_buffers = 2;  // first and second moments
  static constexpr const char* name = "LAMB";
  static constexpr bool per_tensor = true;
  static constexpr float clip_epsilon = 0.0f;  // Apex divides by exactly |g| / max_grad_norm
  float beta1, beta2, eps;
  bool bias_correction, grad_averaging, adam_w, nvlamb;

  AMP_HOST_DEVICE float beta1_or_one() const { return beta1; }
  AMP_HOST_DEVICE float beta2_or_one() const { return beta2; }
  // The step direction of one element; advances its moments *m and *v.
  AMP_HOST_DEVICE float direction(float x, float g, float* m, float* v, const StepValues& s, float wd) const {
    if (!adam_w) g += wd * x;
    const float m1 = beta1 * *m + (grad_averaging ? 1.0f - beta1 : 1.0f) * g;
    const float v1 = beta2 * *v + (1.0f - beta2) * g * g;
    *m = m1;
    *v = v1;
    const float bc1 = bias_correction ? 1.0f - s.beta1_pow : 1.0f;  // s.beta*_pow include this step
    const float bc2 = bias_correction ? 1.0f - s.beta2_pow : 1.0f;
    const float u = (m1 / bc1) / (sqrtf(v1 / bc2) + eps);
    return adam_w ? u + wd * x : u;
  }
  // A tensor's step size from its norms.
  AMP_HOST_DEVICE float rate(float x_norm, float u_norm, float lr, float wd) const {
    if (!(nvlamb || wd != 0.0f) || x_norm == 0.0f || u_norm == 0.0f) return lr;
    return lr * (x_norm / u_norm);
  }
};

template <Policy P, Backend B>
class LAMB : public FusedOptimizer<P, B, LambRule> {
 public:
  using Store = nn::ParameterStore<P, B>;
  LAMB(Store& params, LambOptions o = {}, StepOptions step = {})
      : LAMB(std::vector<Store*>{&params}, std::move(o), std::move(step)) {}
  LAMB(std::vector<Store*> params, LambOptions o = {}, StepOptions step = {})
      : FusedOptimizer<P, B, LambRule>(std::move(params), rule(o), o.lr, o.weight_decay,
                                       pre_normalised(std::move(step), o)) {}

 private:
  static StepOptions pre_normalised(StepOptions step, const LambOptions& o) {
    AMP_REQUIRE(step.max_grad_norm == 0, "LAMB: the pre-normalisation is LambOptions::max_grad_norm (default 1, as "
                "Apex's); leave StepOptions::max_grad_norm at 0, got ", step.max_grad_norm);
    step.max_grad_norm = o.max_grad_norm;
    return step;
  }
  static LambRule rule(const LambOptions& o) {
    AMP_REQUIRE(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "LAMB: betas must lie in [0, 1), got ",
                o.beta1, ", ", o.beta2);
    AMP_REQUIRE(o.eps > 0 && o.weight_decay >= 0, "LAMB: need eps > 0 and weight_decay >= 0, got ", o.eps, ", ",
                o.weight_decay);
    return {o.beta1, o.beta2, o.eps, o.bias_correction, o.grad_averaging, o.adam_w_mode, o.use_nvlamb};
  }
};

}  // namespace amp::optim
