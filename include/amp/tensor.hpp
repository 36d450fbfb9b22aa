#pragma once
// Shapes, views and owning tensors over backend memory. Tensors are contiguous
// and row-major; image tensors are channels-last [N, H, W, C] (the layout
// cuDNN and tensor cores like best), and the 2-D view [rows, cols] flattens the
// leading dimensions into rows.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "amp/backend/buffer.hpp"

namespace amp {

class Shape {
 public:
  static constexpr int max_rank = 5;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) {
    AMP_REQUIRE(dims.size() <= max_rank, "Shape: rank ", dims.size(), " exceeds ", max_rank);
    for (auto d : dims) push(d);
  }

  int rank() const { return rank_; }
  std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i < 0 ? rank_ + i : i)]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }
  // Rows and columns of the 2-D view (leading dims flattened into rows).
  std::int64_t cols() const { return rank_ == 0 ? 1 : dims_[static_cast<std::size_t>(rank_ - 1)]; }
  std::int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }

  Shape& push(std::int64_t d) {
    AMP_REQUIRE(rank_ < max_rank, "Shape: rank exceeds ", max_rank);
    AMP_REQUIRE(d >= 0, "Shape: negative dimension ", d);
    dims_[static_cast<std::size_t>(rank_++)] = d;
    return *this;
  }
  // The same shape with dimension i set to d.
  Shape with(int i, std::int64_t d) const {
    Shape s = *this;
    s.dims_[static_cast<std::size_t>(i < 0 ? rank_ + i : i)] = d;
    return s;
  }
  // [batch] followed by this shape: a per-sample shape made a batch.
  Shape batched(std::int64_t batch) const {
    Shape s{batch};
    for (int i = 0; i < rank_; ++i) s.push(dims_[static_cast<std::size_t>(i)]);
    return s;
  }
  // This shape without its first dimension.
  Shape sample() const {
    Shape s;
    for (int i = 1; i < rank_; ++i) s.push(dims_[static_cast<std::size_t>(i)]);
    return s;
  }

  bool operator==(const Shape& o) const {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[static_cast<std::size_t>(i)] != o.dims_[static_cast<std::size_t>(i)]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) {
      if (i) s += 'x';
      s += std::to_string(dims_[static_cast<std::size_t>(i)]);
    }
    return s + "]";
  }

 private:
  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
};

// A non-owning contiguous view: data and shape.
template <class T>
struct TensorView {
  T* data = nullptr;
  Shape shape;

  TensorView() = default;
  TensorView(T* d, Shape s) : data(d), shape(s) {}
  template <class U>
    requires adds_const<U, T>
  TensorView(TensorView<U> o) : data(o.data), shape(o.shape) {}

  std::int64_t numel() const { return shape.numel(); }
  std::size_t size() const { return static_cast<std::size_t>(shape.numel()); }
  Span<T> span() const { return {data, size()}; }
  Matrix<T> matrix() const { return amp::matrix(data, shape.rows(), shape.cols()); }
};

template <class T, Backend B>
class Tensor {
 public:
  Tensor() = default;
  Tensor(Context<B>& ctx, Shape shape, memory_kind kind)
      : shape_(shape), buffer_(ctx, static_cast<std::size_t>(shape.numel()), kind) {}

  const Shape& shape() const { return shape_; }
  T* data() const { return buffer_.data(); }
  std::size_t size() const { return buffer_.size(); }
  Span<T> span() const { return buffer_.span(); }
  Matrix<T> matrix() const { return amp::matrix(buffer_.data(), shape_.rows(), shape_.cols()); }
  TensorView<T> view() const { return {buffer_.data(), shape_}; }

 private:
  Shape shape_;
  Buffer<T, B> buffer_;
};

}  // namespace amp
