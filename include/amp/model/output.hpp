#pragma once
// What Model::forward returns for each output of the net: the tensor and the
// graph it lives on (where a loss seeds its gradient and runs backward). Its
// values are there until the graph starts a new iteration; reading them after
// that is an error, not another forward's values.
#include "amp/model/graph.hpp"

namespace amp::nn {

template <Policy P, Backend B, class U = typename P::activation_type>
struct Output {
  using value_type = U;
  Var<U> var;
  Graph<P, B>* graph = nullptr;

  Output() = default;
  Output(Var<U> v, Graph<P, B>* g) : var(v), graph(g) {}
  // [rows, last dimension], while the iteration lasts.
  Matrix<const U> value() const {
    require_current("Output::value()");
    return var.matrix();
  }
  operator Matrix<const U>() const { return value(); }
  // Throws unless the output belongs to its graph's iteration in progress.
  template <class... Who>
  void require_current(const Who&... who) const {
    AMP_REQUIRE(graph, who..., ": an empty Output (no forward made it)");
    graph->require_current(var, who...);
  }
  std::int64_t rows() const { return var.rows(); }
  std::int64_t cols() const { return var.cols(); }
  const Shape& shape() const { return var.shape; }
};

}  // namespace amp::nn
