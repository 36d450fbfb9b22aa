#pragma once
// CUDA and cuBLAS status checks: the thrown amp::Error names the failing call.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "amp/core/error.hpp"
#include "amp/core/macros.hpp"

#define AMP_CUDA_CHECK(call)                                                                               \
  do {                                                                                                     \
    const cudaError_t amp_status_ = (call);                                                                \
    if (amp_status_ != cudaSuccess)                                                                        \
      ::amp::fail("CUDA error in ", #call, " (" __FILE__ ":" AMP_STRINGIFY(__LINE__) "): ",                \
                  cudaGetErrorName(amp_status_), ": ", cudaGetErrorString(amp_status_));                   \
  } while (0)

#define AMP_CUBLAS_CHECK(call)                                                                             \
  do {                                                                                                     \
    const cublasStatus_t amp_status_ = (call);                                                             \
    if (amp_status_ != CUBLAS_STATUS_SUCCESS)                                                              \
      ::amp::fail("cuBLAS error in ", #call, " (" __FILE__ ":" AMP_STRINGIFY(__LINE__) "): ",              \
                  cublasGetStatusName(amp_status_), ": ", cublasGetStatusString(amp_status_));             \
  } while (0)

namespace amp::detail {

// Whether queued work has finished, from cudaEventQuery / cudaStreamQuery.
// cudaErrorNotReady is an answer, not a failure, yet the runtime also keeps
// it as the thread's last error, where the next launch's check (amp's or
// CUB's cudaGetLastError) would report "device not ready": it is cleared here,
// as PyTorch's CUDAStream::query does. Any other status is an error.
inline bool cuda_ready(cudaError_t status, const char* what) {
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  if (status != cudaSuccess) ::amp::fail("CUDA error in ", what, ": ", cudaGetErrorName(status), ": ", cudaGetErrorString(status));
  return true;
}

// A call that failed in a destructor (which cannot throw): said on stderr
// and cleared, so the next launch's check does not report it as its own.
inline void report_in_destructor(const char* call, cudaError_t status) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "amp: %s failed while releasing: %s: %s\n", call, cudaGetErrorName(status),
               cudaGetErrorString(status));
  (void)cudaGetLastError();
}

}  // namespace amp::detail
