#pragma once
// The GEMM contract shared by both backends, row-major:
//   Z = alpha * op(A) op(B) + beta * C + bias,   C = act(Z),   op(X) = X or X^T,
// with A and B of one input type, C of that type or fp32, fp32 accumulation and
// one rounding into C: bias and activation are applied in the epilogue, before
// the final cast (cuBLASLt's BIAS / RELU_BIAS / GELU_AUX_BIAS on the GPU).
#include <cstdint>
#include <string>
#include <type_traits>

#include "amp/core/activation.hpp"
#include "amp/core/error.hpp"
#include "amp/core/fp8.hpp"
#include "amp/core/span.hpp"
#include "amp/core/traits.hpp"

namespace amp {

enum class transpose : bool { no = false, yes = true };

struct GemmDims {
  std::int64_t m, n, k;
};

// What the GEMM does besides the product, fused into its pass. Out is C's type.
template <class Out>
struct GemmEpilogue {
  float alpha = 1.0f;
  float beta = 0.0f;
  const Out* bias = nullptr;        // one value per column of C (per output feature)
  activation act = activation::none;
  Out* pre_activation = nullptr;    // Z before act, laid out like C: what act's backward needs
  // grad_bias[i] += sum_k op(A)[i][k]: the bias gradient when op(A) = dY^T
  // (the weight-gradient GEMM; cuBLASLt's BGRADB).
  Out* grad_bias = nullptr;

  bool plain() const { return !bias && act == activation::none && !pre_activation && !grad_bias; }
};

// Many products of one shape at once (attention's heads): product i reads
// A at a.data + i * stride_a, B at b.data + i * stride_b, writes C at
// c.data + i * stride_c (strides in elements). Plain alpha/beta only.
struct GemmBatch {
  std::int64_t count = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

namespace detail {
template <class T>
std::string matrix_desc(const char* name, Matrix<T> x, transpose t) {
  return concat(name, t == transpose::yes ? "^T" : "", " [", t == transpose::yes ? x.cols : x.rows, "x",
                t == transpose::yes ? x.rows : x.cols, "]");
}
}  // namespace detail

// The epilogue combinations both backends fuse.
template <class Out>
void check_epilogue(const GemmEpilogue<Out>& ep) {
  AMP_REQUIRE(!ep.pre_activation || ep.act == activation::gelu,
              "gemm: pre_activation is kept for gelu only (relu's backward reads its output)");
  AMP_REQUIRE(!ep.grad_bias || (!ep.bias && ep.act == activation::none),
              "gemm: the bias gradient is fused alone (into the weight-gradient product)");
}

// Dimensions of the product, or an amp::Error naming the mismatched shapes.
template <class TA, class TB, class TC>
GemmDims gemm_dims(Matrix<const TA> a, transpose ta, Matrix<const TB> b, transpose tb, Matrix<TC> c) {
  static_assert(std::is_same_v<TA, TB>, "gemm: A and B must share one element type");
  static_assert(std::is_same_v<TC, TA> || std::is_same_v<TC, float>, "gemm: C is the input type or fp32");
  const std::int64_t m = ta == transpose::yes ? a.cols : a.rows;
  const std::int64_t k = ta == transpose::yes ? a.rows : a.cols;
  const std::int64_t kb = tb == transpose::yes ? b.cols : b.rows;
  const std::int64_t n = tb == transpose::yes ? b.rows : b.cols;
  AMP_REQUIRE(k == kb && c.rows == m && c.cols == n, "gemm: shapes do not match: ",
              detail::matrix_desc("A", a, ta), " * ", detail::matrix_desc("B", b, tb), " -> C [", c.rows, "x",
              c.cols, "]");
  AMP_REQUIRE(a.ld >= a.cols && b.ld >= b.cols && c.ld >= c.cols, "gemm: leading dimension smaller than row length");
  return {m, n, k};
}

// An FP8 GEMM operand: its codes, and where 1 / scale lives (backend memory,
// read when the GEMM runs: a delayed-scaling step changes it on the device).
template <class F>
struct Fp8Matrix {
  Matrix<const F> codes;
  const float* scale_inv = nullptr;
};

// FP8 GEMM, row-major, TN only (Hopper's FP8 tensor cores take both operands
// K-major; the casts write the transposed copies they need):
//   C = act(alpha * a_inv * b_inv * A B^T + beta * C + bias),  A [m x k], B [n x k],
// fp32 accumulation, one rounding into C (bf16, fp16 or fp32). No bias
// gradient epilogue (it comes from the unquantised gradient instead).
template <class FA, class FB, class TC>
GemmDims gemm_fp8_dims(const Fp8Matrix<FA>& a, const Fp8Matrix<FB>& b, Matrix<TC> c, const GemmEpilogue<TC>& ep) {
  static_assert(is_fp8_v<FA> && is_fp8_v<FB>, "gemm_fp8: operands are fp8_e4m3 or fp8_e5m2");
  static_assert(!(std::is_same_v<FA, fp8_e5m2> && std::is_same_v<FB, fp8_e5m2>),
                "gemm_fp8: two E5M2 operands have no FP8 tensor-core kernel (one must be E4M3)");
  check_epilogue(ep);
  AMP_REQUIRE(!ep.grad_bias, "gemm_fp8: no bias-gradient epilogue (sum the unquantised gradient instead)");
  AMP_REQUIRE(a.scale_inv && b.scale_inv, "gemm_fp8: both operands need their 1/scale");
  AMP_REQUIRE(a.codes.cols == b.codes.cols && c.rows == a.codes.rows && c.cols == b.codes.rows,
              "gemm_fp8: shapes do not match: A [", a.codes.rows, "x", a.codes.cols, "] * B^T [", b.codes.cols, "x",
              b.codes.rows, "] -> C [", c.rows, "x", c.cols, "]");
  AMP_REQUIRE(a.codes.ld >= a.codes.cols && b.codes.ld >= b.codes.cols && c.ld >= c.cols,
              "gemm_fp8: leading dimension smaller than row length");
  return {a.codes.rows, b.codes.rows, a.codes.cols};
}

}  // namespace amp
