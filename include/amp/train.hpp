#pragma once
// The scaled loss, Apex's three lines in C++:
//   opt.zero_grad();
//   amp::scale_loss(loss, opt).backward();  // loss x scale, back-propagated
//   opt.step();                             // check, update (skipped on the device on overflow), scale update
// The check runs in the step, not at the end of a scope; nothing here waits
// for the device. The explicit PyTorch form: scaler.scale(loss).backward();
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
