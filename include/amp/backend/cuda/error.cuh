#pragma once
// CUDA and cuBLAS status checks: the thrown amp::Error names the failing call.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

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
