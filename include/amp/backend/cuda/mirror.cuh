#pragma once
// The GPU mirror: an async copy into pinned memory plus an event. latest()
// returns the last copy that has landed (a step or so behind), without a sync.
#include "amp/backend/cuda/context.cuh"
#include "amp/backend/host/mirror.hpp"

namespace amp {

template <class T>
class Mirror<T, cuda> {
 public:
  explicit Mirror(Context<cuda>& ctx) : ctx_(&ctx) {
    pinned_ = static_cast<T*>(ctx.allocate_pinned(sizeof(T)));
    AMP_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;
  ~Mirror() {
    detail::report_in_destructor("cudaEventSynchronize", cudaEventSynchronize(event_));
    cudaEventDestroy(event_);
    ctx_->deallocate_pinned(pinned_);
  }

  void refresh(Context<cuda>& ctx, const T* src) {
    ctx.activate();
    const auto landed = [&] { return detail::cuda_ready(cudaEventQuery(event_), "cudaEventQuery (a mirror's copy)"); };
    if (!slot_.take(landed, *pinned_)) return;  // the previous copy is still in flight: keep it
    AMP_CUDA_CHECK(cudaMemcpyAsync(pinned_, src, sizeof(T), cudaMemcpyDeviceToHost, ctx.stream()));  // pinned: async
    AMP_CUDA_CHECK(cudaEventRecord(event_, ctx.stream()));
  }
  const T* latest() const { return slot_.latest(); }

 private:
  Context<cuda>* ctx_;
  T* pinned_ = nullptr;
  cudaEvent_t event_ = nullptr;
  detail::MirrorSlot<T> slot_;
};

}  // namespace amp
