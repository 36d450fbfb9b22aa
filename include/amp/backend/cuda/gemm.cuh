#pragma once
// GPU GEMM on cuBLAS. Element types map to cuBLAS data types at compile time;
// fp32 accumulation (CUBLAS_COMPUTE_32F) everywhere, which for fp32 operands
// means strict fp32 with no TF32 (the O0 contract).
#include <type_traits>

#include "amp/backend/cuda/context.cuh"
#include "amp/backend/gemm.hpp"
#include "amp/core/numeric.hpp"

namespace amp {

namespace detail {
template <class T>
constexpr cudaDataType_t cuda_data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, half>) return CUDA_R_16F;
  else {
    static_assert(std::is_same_v<T, bfloat16>, "no cuBLAS type for this element");
    return CUDA_R_16BF;
  }
}

inline cublasOperation_t cublas_op(transpose t) { return t == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }
}  // namespace detail

template <class Acc = float, class TA, class TB, class TC>
void gemm(Context<cuda>& ctx, Matrix<const TA> a, transpose ta, Matrix<const TB> b, transpose tb, Matrix<TC> c,
          float alpha = 1.0f, float beta = 0.0f) {
  static_assert(std::is_same_v<Acc, float>, "cuda gemm accumulates in fp32");
  const GemmDims d = gemm_dims(a, ta, b, tb, c);
  if (d.m == 0 || d.n == 0) return;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap operands.
  AMP_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), detail::cublas_op(tb), detail::cublas_op(ta), static_cast<int>(d.n),
                                static_cast<int>(d.m), static_cast<int>(d.k), &alpha, b.data,
                                detail::cuda_data_type<TB>(), static_cast<int>(b.ld), a.data,
                                detail::cuda_data_type<TA>(), static_cast<int>(a.ld), &beta, c.data,
                                detail::cuda_data_type<TC>(), static_cast<int>(c.ld), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
}

}  // namespace amp
