#pragma once
// The GPU backend's context: device, stream, cuBLAS(Lt) handles and workspace.
// All work of a context is ordered on its one stream; nothing here synchronises
// except the explicit download and synchronize calls. Every entry that calls
// CUDA makes the context's device current first (activate()), so contexts on
// two GPUs can be used from one thread.
#include <string>

#include "amp/backend/backend.hpp"
#include "amp/backend/capability.hpp"
#include "amp/backend/cuda/device.hpp"
#include "amp/backend/cuda/error.cuh"
#include "amp/backend/cuda/lt_plans.cuh"
#include "amp/backend/cuda/versions.cuh"

namespace amp {

template <>
class Context<cuda> : public ContextBase<Context<cuda>> {
 public:
  static constexpr std::size_t cublas_workspace_bytes = 32u << 20;  // what cuBLAS asks for on Hopper

  explicit Context(int device = 0) : device_(device) {
    const int count = cuda_device_count();
    AMP_REQUIRE(device >= 0 && device < count, "amp::Context<cuda>: device ", device, " requested but ",
                count == 0 ? cuda_unavailable_reason() : detail::concat(count, " device(s) present"));
    detail::check_cublas_version();
    AMP_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    AMP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    capability_ = {prop.name, prop.major, prop.minor};
    multiprocessors_ = prop.multiProcessorCount;
    AMP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    AMP_CUBLAS_CHECK(cublasCreate(&cublas_));
    AMP_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    AMP_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
    workspace_ = allocate(cublas_workspace_bytes, memory_kind::workspace);
    AMP_CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace_, cublas_workspace_bytes));
  }

  // Checks that this GPU can run policy P (fp16: 7.0+, bf16: 8.0+); layers and
  // optimizers call it, so an unsupported GPU fails at model build, not mid-run.
  template <Policy P>
  Context(int device, P) : Context(device) {
    require<P>();
  }

  ~Context() {
    detail::report_in_destructor("cudaSetDevice", cudaSetDevice(device_));
    detail::report_in_destructor("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
    release_scratch();
    deallocate(workspace_, cublas_workspace_bytes, memory_kind::workspace);
    cublasLtDestroy(cublaslt_);
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }

  template <Policy P>
  void require() const {
    require_support<P>(capability_);
  }

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cublasLtHandle_t cublaslt() const { return cublaslt_; }
  // cuBLASLt plans made so far, one per GEMM case (lt_plans.cuh).
  detail::LtPlans& lt_plans() { return lt_plans_; }
  void* cublas_workspace() const { return workspace_; }
  const DeviceCapability& capability() const { return capability_; }
  const std::string& device_name() const { return capability_.name; }
  int multiprocessors() const { return multiprocessors_; }

  // Makes this context's device current for the calling thread (a cheap
  // query when it already is).
  void activate() const {
    int current = -1;
    AMP_CUDA_CHECK(cudaGetDevice(&current));
    if (current != device_) AMP_CUDA_CHECK(cudaSetDevice(device_));
  }

 private:
  friend class ContextBase<Context<cuda>>;

  void* raw_allocate(std::size_t bytes) {
    activate();
    void* p = nullptr;
    AMP_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  void raw_free(void* p) {
    cudaSetDevice(device_);
    detail::report_in_destructor("cudaFree", cudaFree(p));
  }
  void* raw_allocate_pinned(std::size_t bytes) {
    activate();
    void* p = nullptr;
    AMP_CUDA_CHECK(cudaMallocHost(&p, bytes));
    return p;
  }
  void raw_free_pinned(void* p) {
    detail::report_in_destructor("cudaFreeHost", cudaFreeHost(p));
  }
  void raw_synchronize() {
    activate();
    AMP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void raw_copy_to_device(void* dst, const void* src, std::size_t bytes) {
    activate();
    AMP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void raw_copy_to_host(void* dst, const void* src, std::size_t bytes) {
    activate();
    AMP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  void raw_copy(void* dst, const void* src, std::size_t bytes) {
    activate();
    AMP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  int device_ = 0;
  DeviceCapability capability_;
  int multiprocessors_ = 1;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  void* workspace_ = nullptr;
  detail::LtPlans lt_plans_;
};

}  // namespace amp
