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
    cudaEventSynchronize(event_);
    cudaEventDestroy(event_);
    ctx_->deallocate_pinned(pinned_);
  }

  void refresh(Context<cuda>& ctx, const T* src) {
    ctx.activate();
    if (pending_ && cudaEventQuery(event_) == cudaSuccess) {
      landed_ = *pinned_;
      has_landed_ = true;
      pending_ = false;
    }
    if (pending_) return;  // the previous copy is still in flight: keep it
    AMP_CUDA_CHECK(cudaMemcpyAsync(pinned_, src, sizeof(T), cudaMemcpyDeviceToHost, ctx.stream()));  // pinned: async
    AMP_CUDA_CHECK(cudaEventRecord(event_, ctx.stream()));
    pending_ = true;
  }
  const T* latest() const { return has_landed_ ? &landed_ : nullptr; }

 private:
  Context<cuda>* ctx_;
  T* pinned_ = nullptr;
  cudaEvent_t event_ = nullptr;
  T landed_{};
  bool pending_ = false;
  bool has_landed_ = false;
};

}  // namespace amp
