#pragma once
// Whether this process can use a GPU, asked through the CUDA runtime's C API
// alone: a translation unit compiled by the C++ compiler (a program's main that
// picks the CPU or the GPU) can ask it too, linking CUDA::cudart.
#include <cuda_runtime_api.h>

#include <string>

#include "amp/core/error.hpp"

namespace amp {

// Number of usable CUDA devices; 0 where there is no GPU or no driver.
inline int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error for later calls
    return 0;
  }
  return n;
}

// Why no GPU work can run here, or "" when it can.
inline std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) (void)cudaGetLastError();  // clear the sticky error for later calls
  if (status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice || (status == cudaSuccess && n == 0))
    return detail::concat("no NVIDIA driver or GPU found (", cudaGetErrorName(status), ")");
  if (status != cudaSuccess)
    return detail::concat("no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorName(status), ": ",
                          cudaGetErrorString(status), ")");
  return "";
}

}  // namespace amp
