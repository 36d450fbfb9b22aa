#pragma once
// Host GEMM on a real CBLAS. Low-precision operands are widened to fp32 (exact)
// and multiplied with fp32 accumulation: the numerical contract of the GPU path.
// bf16 runs natively where the CPU has AVX512-BF16 (gemm_bf16.hpp).
#include <type_traits>

#include <cblas.h>

#include "amp/backend/gemm.hpp"
#include "amp/backend/host/algorithm.hpp"
#include "amp/backend/host/gemm_bf16.hpp"
#include "amp/core/numeric.hpp"

namespace amp {

namespace detail {
// Contiguous fp32 copy of a (possibly strided) matrix in a scratch slot.
template <class T>
Matrix<const float> widen(Context<host>& ctx, Matrix<const T> x, scratch_slot slot) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    float* out = ctx.scratch<float>(slot, static_cast<std::size_t>(x.rows * x.cols));
    if (x.contiguous()) {  // the common case: a flat, vectorisable pass with no index arithmetic
      for_each(ctx, static_cast<std::size_t>(x.rows * x.cols), [=](std::size_t i) { out[i] = cast<float>(x.data[i]); });
    } else {
      for_each(ctx, static_cast<std::size_t>(x.rows), [=](std::size_t r) {
        for (std::int64_t c = 0; c < x.cols; ++c) out[r * x.cols + c] = cast<float>(x.data[r * x.ld + c]);
      });
    }
    return {out, x.rows, x.cols, x.cols};
  }
}

inline CBLAS_TRANSPOSE cblas_op(transpose t) { return t == transpose::yes ? CblasTrans : CblasNoTrans; }
}  // namespace detail

template <class Acc = float, class TA, class TB, class TC>
void gemm(Context<host>& ctx, Matrix<const TA> a, transpose ta, Matrix<const TB> b, transpose tb, Matrix<TC> c,
          float alpha = 1.0f, float beta = 0.0f) {
  static_assert(std::is_same_v<Acc, float>, "host gemm accumulates in fp32");
  const GemmDims d = gemm_dims(a, ta, b, tb, c);
  if (d.m == 0 || d.n == 0) return;
  if constexpr (std::is_same_v<TA, bfloat16>) {
    if (detail::gemm_bf16_native(ctx, a, ta, b, tb, c, d, alpha, beta)) return;
  }
  const Matrix<const float> wa = detail::widen(ctx, a, scratch_slot::gemm_a);
  const Matrix<const float> wb = detail::widen(ctx, b, scratch_slot::gemm_b);
  if constexpr (std::is_same_v<TC, float>) {
    cblas_sgemm(CblasRowMajor, detail::cblas_op(ta), detail::cblas_op(tb), static_cast<int>(d.m),
                static_cast<int>(d.n), static_cast<int>(d.k), alpha, wa.data, static_cast<int>(wa.ld), wb.data,
                static_cast<int>(wb.ld), beta, c.data, static_cast<int>(c.ld));
  } else {
    // fp32 result first, then one rounding into C (beta reads the old C in fp32).
    const Matrix<float> wc{ctx.scratch<float>(scratch_slot::gemm_c, static_cast<std::size_t>(d.m * d.n)), d.m, d.n,
                           d.n};
    cblas_sgemm(CblasRowMajor, detail::cblas_op(ta), detail::cblas_op(tb), static_cast<int>(d.m),
                static_cast<int>(d.n), static_cast<int>(d.k), alpha, wa.data, static_cast<int>(wa.ld), wb.data,
                static_cast<int>(wb.ld), 0.0f, wc.data, static_cast<int>(wc.ld));
    const std::int64_t n = d.n;
    for_each(ctx, static_cast<std::size_t>(d.m), [=](std::size_t r) {
      TC* out = c.data + static_cast<std::int64_t>(r) * c.ld;
      const float* in = wc.data + static_cast<std::int64_t>(r) * n;
      if (beta == 0.0f) {
        for (std::int64_t j = 0; j < n; ++j) out[j] = cast<TC>(in[j]);
      } else {
        for (std::int64_t j = 0; j < n; ++j) out[j] = cast<TC>(in[j] + beta * cast<float>(out[j]));
      }
    });
  }
}

}  // namespace amp
