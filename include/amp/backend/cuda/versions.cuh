#pragma once
// The libraries the GPU backend loads, against the headers it was built with.
// A binary built here runs on machines whose cuBLAS and cuDNN come from
// elsewhere (a toolkit, PyTorch's wheels): a library of another major version
// is refused when the context or handle is made; an older minor is said once
// on stderr, as the likely cause of what it then refuses (a cuDNN graph with
// no engine, a cuBLASLt case with no algorithm).
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdio>
#include <string>

#include "amp/backend/cuda/error.cuh"

namespace amp {

// Versions as the libraries encode them (cuDNN 9.19.0 = 91900, cuBLAS 13.1.0 = 130100, CUDA 13.0 = 13000);
// cudnn_cuda: the CUDA runtime the loaded cuDNN was built for (PyTorch's wheels carry cuDNN 9 for CUDA 12 too).
struct CudaVersions {
  int driver = 0, runtime = 0;
  std::size_t cudnn = 0, cudnn_built = CUDNN_VERSION, cudnn_cuda = 0;
  std::size_t cublas = 0, cublas_built = CUBLAS_VERSION;

  static CudaVersions loaded() {
    CudaVersions v;
    AMP_CUDA_CHECK(cudaDriverGetVersion(&v.driver));
    AMP_CUDA_CHECK(cudaRuntimeGetVersion(&v.runtime));
    v.cudnn = cudnnGetVersion();
    v.cudnn_cuda = cudnnGetCudartVersion();
    v.cublas = cublasLtGetVersion();
    return v;
  }
  // One line for logs: what scripts/gpu_summary.py reads.
  std::string line() const {
    return "[amp-versions] driver=" + std::to_string(driver) + " runtime=" + std::to_string(runtime) +
           " cudnn=" + std::to_string(cudnn) + " cudnn_built=" + std::to_string(cudnn_built) +
           " cudnn_cuda=" + std::to_string(cudnn_cuda) +
           " cublas=" + std::to_string(cublas) + " cublas_built=" + std::to_string(cublas_built);
  }
};

namespace detail {

// Refuses another major version; says once when the loaded library is older than the headers.
inline void check_library_version(const char* name, std::size_t loaded, std::size_t built, bool& said) {
  AMP_REQUIRE(loaded / 10000 == built / 10000, "amp: the loaded ", name, " is version ", loaded, ", amp was built with ",
              built, " headers: another major version. Put the matching library first on LD_LIBRARY_PATH");
  if (loaded < built && !said) {
    said = true;
    std::fprintf(stderr,
                 "amp: the loaded %s (%zu) is older than the headers amp was built with (%zu): what it refuses "
                 "(a plan without an engine, a case without an algorithm) is likely for that reason\n",
                 name, loaded, built);
  }
}
inline void check_cublas_version() {
  static bool said = false;
  check_library_version("cuBLASLt", cublasLtGetVersion(), CUBLAS_VERSION, said);
}
inline void check_cudnn_version() {
  static bool said = false;
  check_library_version("cuDNN", cudnnGetVersion(), CUDNN_VERSION, said);
  // Its run-time compiled engines (fused convolutions, attention) load the CUDA libraries of its own major.
  const std::size_t cuda = cudnnGetCudartVersion();
  AMP_REQUIRE(cuda / 1000 == CUDART_VERSION / 1000, "amp: the loaded cuDNN ", cudnnGetVersion(), " is built for CUDA ",
              cuda / 1000, ", amp for CUDA ", CUDART_VERSION / 1000, ": put cuDNN for CUDA ", CUDART_VERSION / 1000,
              " first on LD_LIBRARY_PATH");
}

}  // namespace detail
}  // namespace amp
