#pragma once
// cuBLASLt plans, made once per GEMM case and kept by the context: the matmul
// descriptor, the three layouts and the algorithm the heuristic chose for one
// (shape, leading dimensions, transposes, types, epilogue, alignment). A
// training step asks for the same few cases every iteration, so after the
// first step a GEMM sets its pointers on a cached descriptor and launches:
// no descriptor, layout or heuristic work in the loop (or in a captured graph).
// A case with no algorithm is remembered as such, logged once, and takes the
// tested fallback (gemm.cuh) every time.
#include <cstdint>
#include <cstdio>
#include <map>
#include <tuple>

#include "amp/backend/cuda/error.cuh"

namespace amp::detail {

// The largest power of two (up to 16 bytes) dividing the address: what
// cuBLASLt's kernels may assume about a pointer.
inline std::uint32_t pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (std::uint32_t bytes : {16u, 8u, 4u, 2u})
    if (a % bytes == 0) return bytes;
  return 1;
}

struct LtPlanKey {
  std::int64_t m, n, k, lda, ldb, ldc, aux_ld;
  int trans_a, trans_b, type_a, type_b, type_c, epilogue;
  std::uint32_t align_a, align_b, align_c, align_bias;
  auto tie() const {
    return std::tie(m, n, k, lda, ldb, ldc, aux_ld, trans_a, trans_b, type_a, type_b, type_c, epilogue, align_a,
                    align_b, align_c, align_bias);
  }
  bool operator<(const LtPlanKey& o) const { return tie() < o.tie(); }
};

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // the heuristic's answer
  bool found = false;
};

class LtPlans {
 public:
  LtPlans() = default;
  LtPlans(const LtPlans&) = delete;
  LtPlans& operator=(const LtPlans&) = delete;
  ~LtPlans() {
    for (auto& [key, p] : plans_) {
      if (p.lc) cublasLtMatrixLayoutDestroy(p.lc);
      if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
      if (p.la) cublasLtMatrixLayoutDestroy(p.la);
      if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    }
  }

  // The plan for key, made by make(plan) the first time it is asked for.
  template <class Make>
  LtPlan& get(const LtPlanKey& key, Make&& make) {
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    LtPlan& p = plans_[key];
    make(p);
    if (!p.found)
      std::fprintf(stderr,
                   "amp: cuBLASLt has no algorithm for a %lldx%lldx%lld GEMM (types %d/%d/%d, epilogue %d, alignment "
                   "%u/%u/%u bytes): %s; it takes the fallback (logged once)\n",
                   static_cast<long long>(key.m), static_cast<long long>(key.n), static_cast<long long>(key.k),
                   key.type_a, key.type_b, key.type_c, key.epilogue, key.align_a, key.align_b, key.align_c,
                   p.status == CUBLAS_STATUS_SUCCESS ? "the heuristic found none" : cublasGetStatusName(p.status));
    return p;
  }
  std::size_t size() const { return plans_.size(); }

 private:
  std::map<LtPlanKey, LtPlan> plans_;
};

}  // namespace amp::detail
