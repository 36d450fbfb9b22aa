#pragma once
// What Model::forward returns for each output of the net: the tensor, a 2-D
// view of its values, and the graph it lives on (where a loss seeds its
// gradient and runs backward).
#include "amp/nn/graph.hpp"

namespace amp::nn {

template <Policy P, Backend B, class U = typename P::activation_type>
struct Output {
  using value_type = U;
  Var<U> var;
  Graph<P, B>* graph = nullptr;
  Matrix<const U> value;  // [rows, last dimension]

  Output() = default;
  Output(Var<U> v, Graph<P, B>* g) : var(v), graph(g), value(v.matrix()) {}
  std::int64_t rows() const { return value.rows; }
  std::int64_t cols() const { return value.cols; }
  const Shape& shape() const { return var.shape; }
  operator Matrix<const U>() const { return value; }
};

}  // namespace amp::nn
