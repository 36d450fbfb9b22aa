#pragma once
// Non-owning views over backend memory: a flat span and a row-major matrix.
// Both are trivially copyable, so functors capture them by value into kernels.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "amp/core/macros.hpp"

namespace amp {

// Span<T> converts to Span<const T>, never the other way.
template <class From, class To>
concept adds_const = std::is_same_v<const From, To> && !std::is_same_v<From, To>;

template <class T>
struct Span {
  using value_type = T;
  T* data = nullptr;
  std::size_t size = 0;

  Span() = default;
  AMP_HOST_DEVICE Span(T* d, std::size_t n) : data(d), size(n) {}
  template <class U>
    requires adds_const<U, T>
  AMP_HOST_DEVICE Span(Span<U> o) : data(o.data), size(o.size) {}

  AMP_HOST_DEVICE T& operator[](std::size_t i) const { return data[i]; }
  AMP_HOST_DEVICE bool empty() const { return size == 0; }
  AMP_HOST_DEVICE Span subspan(std::size_t offset, std::size_t count) const {
    return {data + offset, count};
  }
};

// Row-major matrix view; `ld` is the distance between rows in elements.
template <class T>
struct Matrix {
  T* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t ld = 0;

  Matrix() = default;
  AMP_HOST_DEVICE Matrix(T* d, std::int64_t r, std::int64_t c, std::int64_t l) : data(d), rows(r), cols(c), ld(l) {}
  template <class U>
    requires adds_const<U, T>
  AMP_HOST_DEVICE Matrix(Matrix<U> o) : data(o.data), rows(o.rows), cols(o.cols), ld(o.ld) {}

  AMP_HOST_DEVICE T& operator()(std::int64_t r, std::int64_t c) const { return data[r * ld + c]; }
  AMP_HOST_DEVICE bool contiguous() const { return ld == cols; }
  AMP_HOST_DEVICE std::int64_t size() const { return rows * cols; }
  AMP_HOST_DEVICE Span<T> span() const { return {data, static_cast<std::size_t>(rows * cols)}; }
  // The first `n` rows: a partial batch inside a buffer planned for the maximum.
  AMP_HOST_DEVICE Matrix first_rows(std::int64_t n) const { return {data, n, cols, ld}; }
};

template <class T>
Matrix<T> matrix(T* data, std::int64_t rows, std::int64_t cols) {
  return {data, rows, cols, cols};
}

}  // namespace amp
