#pragma once
// oneDNN's GEMMs (libdnnl, what PyTorch's CPU path uses), bound by symbol name.
// amp calls a handful of oneDNN's C functions; declaring them here under amp's
// own names (asm labels) instead of including <dnnl.h> keeps every oneDNN C
// name out of the user's global namespace. Their C ABI is stable since 1.0.
// oneDNN picks its kernels at run time: AVX2, AVX-512, AVX512-BF16 or AMX.
#include <cstdint>
#include <string>

namespace amp::detail::onednn {

// dnnl_status_t, a C enum: 0 is dnnl_success.
using status = int;

// Row-major C = alpha op(A) op(B) + beta C in fp32 (dnnl.h).
status sgemm(char transa, char transb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
             std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc)
    __asm__("dnnl_sgemm");

// The same with bf16 A and B and fp32 accumulation and C; exported by libdnnl
// for its tests and for Intel's framework extensions (not in dnnl.h).
status gemm_bf16bf16f32(char transa, char transb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                        const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb,
                        float beta, float* c, std::int64_t ldc) __asm__("dnnl_gemm_bf16bf16f32");

struct version_t {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};
const version_t* version() __asm__("dnnl_version");
int effective_cpu_isa() __asm__("dnnl_get_effective_cpu_isa");

inline std::string version_string() {
  const version_t* v = version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

// The instruction set oneDNN's kernels use on this CPU (dnnl_cpu_isa_t values).
inline const char* isa_name() {
  switch (effective_cpu_isa()) {
    case 0x1: return "SSE4.1";
    case 0x3: return "AVX";
    case 0x7: return "AVX2";
    case 0x407: return "AVX2-VNNI";
    case 0x27: return "AVX-512";
    case 0x67: return "AVX512-VNNI";
    case 0xe7: return "AVX512-BF16";
    case 0x3e7: return "AMX";
    default: return "other";
  }
}

}  // namespace amp::detail::onednn
