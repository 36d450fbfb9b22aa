#pragma once
// The scaled-loss scope, Apex's three lines in C++:
//   opt.zero_grad();
//   { auto scaled = amp::scale_loss(loss, opt); scaled.backward(); }  // scope end: overflow check
//   opt.step();                                                        // skipped on device on overflow
// Unscaling is fused into the optimizer's step; nothing here waits for the device.
#include <type_traits>

#include "amp/nn/loss.hpp"
#include "amp/scaling/loss_scaler.hpp"

namespace amp {

template <class Loss, class Scaler, class Optimizer>
class ScaledLoss {
 public:
  ScaledLoss(Loss& loss, Scaler& scaler, Optimizer* opt) : loss_(&loss), scaler_(&scaler), opt_(opt) {}
  ScaledLoss(const ScaledLoss&) = delete;
  ScaledLoss& operator=(const ScaledLoss&) = delete;

  // Back-propagates loss * scale; gradients accumulate (scaled) until the step.
  void backward() {
    loss_->backward(scaler_->scale_ptr());
    backward_done_ = true;
  }

  // Scope end: the overflow check over the accumulated gradients. If it cannot
  // be launched, the step runs it instead and reports the error there.
  ~ScaledLoss() {
    if constexpr (!std::is_void_v<Optimizer>) {
      if (backward_done_ && opt_) {
        try {
          scaler_->check(Span<const typename Optimizer::grad_type>(opt_->parameters().grads()));
        } catch (...) {
        }
      }
    }
  }

 private:
  Loss* loss_;
  Scaler* scaler_;
  Optimizer* opt_;
  bool backward_done_ = false;
};

// The three-line form: the optimizer's own scaler, the policy's default.
template <class Loss, class Optimizer>
auto scale_loss(Loss& loss, Optimizer& opt) {
  using Scaler = std::remove_reference_t<decltype(opt.scaler())>;
  return ScaledLoss<Loss, Scaler, Optimizer>(loss, opt.scaler(), &opt);
}

// The explicit form (PyTorch's GradScaler): scaler.scale(loss), then
// scaler.unscale(opt) if wanted, scaler.step(opt), scaler.update().
template <Backend B>
template <class Loss>
auto LossScaler<B>::scale(Loss& loss) {
  return ScaledLoss<Loss, LossScaler<B>, void>(loss, *this, nullptr);
}

}  // namespace amp
