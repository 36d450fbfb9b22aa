#pragma once
// Shapes and owning tensors over backend memory. Layers plan their tensors for a
// maximum batch at build time; a smaller batch is a view of the first rows.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "amp/backend/buffer.hpp"

namespace amp {

class Shape {
 public:
  static constexpr int max_rank = 4;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) {
    AMP_REQUIRE(dims.size() <= max_rank, "Shape: rank ", dims.size(), " exceeds ", max_rank);
    for (auto d : dims) {
      AMP_REQUIRE(d >= 0, "Shape: negative dimension ", d);
      dims_[rank_++] = d;
    }
  }

  int rank() const { return rank_; }
  std::int64_t operator[](int i) const { return dims_[i]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  // Rows and columns of the 2-D view (leading dims flattened into rows).
  std::int64_t cols() const { return rank_ == 0 ? 1 : dims_[rank_ - 1]; }
  std::int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }

  bool operator==(const Shape& o) const {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != o.dims_[i]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) {
      if (i) s += 'x';
      s += std::to_string(dims_[i]);
    }
    return s + "]";
  }

 private:
  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
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

 private:
  Shape shape_;
  Buffer<T, B> buffer_;
};

}  // namespace amp
