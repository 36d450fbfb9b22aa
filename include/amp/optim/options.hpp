#pragma once
// What every optimizer's step takes besides its rule: clipping, gradient
// accumulation, parameter groups, per-tensor norms and its own loss scaler's
// settings. Stated once here; SGD, Adam, AdamW and LAMB take it as the
// argument after their own options:
//   optim::AdamW<P, B> opt(model.parameters(), {.lr = 3e-4f}, {.max_grad_norm = 1.0f});
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "amp/model/parameters.hpp"
#include "amp/scaling/loss_scaler.hpp"

namespace amp::optim {

// Parameters with their own learning rate and weight decay (PyTorch's param groups).
struct ParamGroup {
  std::function<bool(const nn::ParamInfo&)> select;  // which parameters (the first group that selects one wins)
  std::optional<float> lr;                           // default: the optimizer's
  std::optional<float> weight_decay;                 // default: the optimizer's
};

// Selectors for the usual groups.
namespace select {
// Biases and norm parameters: no weight decay (AdamW as GPT-2 is trained).
inline bool no_decay(const nn::ParamInfo& p) { return !p.decay; }
inline bool norms(const nn::ParamInfo& p) { return p.kind == nn::role::norm; }
// The weights of layers kept in fp32 (amp::KeepFp32) in a narrower model.
inline bool fp32_weights(const nn::ParamInfo& p) { return p.kind == nn::role::fp32; }
inline std::function<bool(const nn::ParamInfo&)> prefix(std::string s) {
  return [s](const nn::ParamInfo& p) { return p.name.rfind(s, 0) == 0; };
}
}  // namespace select

struct StepOptions {
  float max_grad_norm = 0.0f;          // > 0: clip by global L2 norm (of the unscaled gradients)
  int accumulation_steps = 1;          // micro-batches summed before each step
  std::vector<ParamGroup> groups = {};  // parameters they do not select form the default group
  bool per_tensor_norms = false;       // keep each parameter's gradient norm (Apex's per_tensor l2norm)
  std::optional<ScalerConfig> scaler = std::nullopt;  // the optimizer's own scaler; default: the policy's
};

}  // namespace amp::optim
