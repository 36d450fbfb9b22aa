#pragma once
// Per-step figures kept on the device (loss, loss scale, skipped steps so far)
// and downloaded once per epoch or interval, so the training loop never waits.
#include <amp/amp.hpp>

namespace examples {

struct StepRecord {
  float loss, scale;
  long long skipped;
};

struct RecordStepOp {
  StepRecord* out;
  const amp::nn::LossValue* loss;
  const amp::ScalerState* scaler;
  AMP_HOST_DEVICE void operator()(std::size_t) const { *out = {loss->value, scaler->scale, scaler->skipped}; }
};

// Records the step into slot `at` of `records`.
template <amp::Backend B, class Loss, class Optimizer>
void record_step(amp::Context<B>& ctx, amp::Buffer<StepRecord, B>& records, std::int64_t at, const Loss& loss,
                 Optimizer& opt) {
  amp::for_each(ctx, 1, RecordStepOp{records.data() + at, loss.value_ptr(), opt.scaler().state_ptr()});
}

}  // namespace examples
