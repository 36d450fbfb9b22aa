#pragma once
// The GEMM contract shared by both backends, row-major:
//   C = alpha * op(A) * op(B) + beta * C,   op(X) = X or X^T,
// with A and B of one input type, C of that type or fp32, and fp32 accumulation.
// The policy's types pick the instantiation; nothing is decided at run time.
#include <cstdint>

#include "amp/core/error.hpp"
#include "amp/core/span.hpp"
#include "amp/core/traits.hpp"

namespace amp {

enum class transpose : bool { no = false, yes = true };

struct GemmDims {
  std::int64_t m, n, k;
};

namespace detail {
template <class T>
std::string matrix_desc(const char* name, Matrix<T> x, transpose t) {
  return concat(name, t == transpose::yes ? "^T" : "", " [", t == transpose::yes ? x.cols : x.rows, "x",
                t == transpose::yes ? x.rows : x.cols, "]");
}
}  // namespace detail

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

}  // namespace amp
