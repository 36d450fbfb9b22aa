#pragma once
// The GPU fence: an event recorded on the context's stream; wait() blocks the
// host until the stream has passed it (at once when it already has).
#include "amp/backend/cuda/context.cuh"
#include "amp/backend/host/fence.hpp"

namespace amp {

template <>
class Fence<cuda> {
 public:
  explicit Fence(Context<cuda>& ctx) {
    ctx.activate();
    AMP_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  Fence(const Fence&) = delete;
  Fence& operator=(const Fence&) = delete;
  ~Fence() {
    detail::report_in_destructor("cudaEventSynchronize", cudaEventSynchronize(event_));
    cudaEventDestroy(event_);
  }
  void record(Context<cuda>& ctx) { AMP_CUDA_CHECK(cudaEventRecord(event_, ctx.stream())); }
  void wait() { AMP_CUDA_CHECK(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace amp
