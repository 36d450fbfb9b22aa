#pragma once
// What a graph hands its ops: tensors recorded on it (Var), where a backward
// writes a gradient (GradOut), and a loss value's slot.
#include <cstddef>
#include <cstdint>

#include "amp/tensor.hpp"

namespace amp::nn {

// A tensor recorded on a graph; id indexes the graph's gradients (-1: no
// gradient flows into it, e.g. class labels or token ids); iteration is the
// graph's iteration it belongs to (0: none).
template <class T>
struct Var {
  T* data = nullptr;
  Shape shape;
  int id = -1;
  std::uint64_t iteration = 0;

  std::size_t size() const { return static_cast<std::size_t>(shape.numel()); }
  TensorView<T> view() const { return {data, shape}; }
  Span<T> span() const { return {data, size()}; }
  Matrix<T> matrix() const { return amp::matrix(data, shape.rows(), shape.cols()); }
  std::int64_t rows() const { return shape.rows(); }
  std::int64_t cols() const { return shape.cols(); }
};

// Where a backward writes its contribution to a gradient: overwrite the first
// time, add afterwards.
template <class T>
struct GradOut {
  T* data = nullptr;
  bool accumulate = false;
  explicit operator bool() const { return data != nullptr; }
};

// A loss value as it is reduced: the mean, and a row whose target was invalid (-1: none).
struct LossValue {
  float value = 0.0f;
  int bad_row = -1;
};

}  // namespace amp::nn
