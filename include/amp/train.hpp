#pragma once
// The scaled-loss scope, Apex's three lines in C++:
//   opt.zero_grad();
//   { auto scaled = amp::scale_loss(loss, opt); scaled.backward(); }  // loss x scale, back-propagated
//   opt.step();                            // check, unscale, step (skipped on the device on overflow), update
// Unscaling is fused into the optimizer's step; nothing here waits for the device.
// The explicit PyTorch form: auto s = scaler.scale(loss); s.backward();
// scaler.unscale(opt) (optional); scaler.step(opt); scaler.update().
#include "amp/nn/loss.hpp"
#include "amp/scaling/loss_scaler.hpp"

namespace amp {

// The three-line form: the optimizer's own scaler, the policy's default.
template <class Loss, class Optimizer>
auto scale_loss(Loss& loss, Optimizer& opt) {
  using Scaler = std::remove_reference_t<decltype(opt.scaler())>;
  return ScaledLoss<Loss, Scaler>(loss, opt.scaler());
}

}  // namespace amp
