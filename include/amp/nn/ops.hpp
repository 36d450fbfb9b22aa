#pragma once
// Building blocks the layers share: element-wise functors written once for
// both backends (math in fp32, one rounding into the stored type), the
// gradient-accumulation rule, typed casts between graph tensors, and per-column
// sums in a fixed order (the same bits for any thread count).
#include <cstdint>
#include <type_traits>

#include "amp/backend/algorithm.hpp"
#include "amp/nn/graph.hpp"

namespace amp::nn {

namespace detail {
// A gradient contribution: written the first time, added afterwards.
template <class T>
AMP_HOST_DEVICE inline void store_grad(T* out, std::size_t i, float v, bool accumulate) {
  out[i] = cast<T>(accumulate ? cast<float>(out[i]) + v : v);
}

// dx (+)= f'(x, y) dy, rounded through the compute type C.
template <class Fn, class C, class T>
struct ActivationGradOp {
  const T* x;  // read only when Fn's backward uses its input (else nullptr)
  const T* y;
  const T* dy;
  T* dx;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const float in = Fn::backward_uses_input ? cast<float>(x[i]) : 0.0f;  // a constant: the loop vectorises
    const float g = round_to<C>(Fn::backward(in, cast<float>(y[i]), cast<float>(dy[i])));
    store_grad(dx, i, g, accumulate);
  }
};

template <class Fn, class C, class T>
struct ActivationOp {
  const T* x;
  T* y;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { y[i] = cast<T>(round_to<C>(Fn::forward(cast<float>(x[i])))); }
};

// dx (+)= dy, for ops whose backward passes a gradient through.
template <class T>
struct AddGradOp {
  const T* dy;
  T* dx;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { store_grad(dx, i, cast<float>(dy[i]), accumulate); }
};

// Column sums of a rows x cols matrix given per element by f(r, c), in two
// fixed-order stages: chunks of rows, then the chunks. Stage one reads a
// chunk's rows once per column (they stay in cache on the CPU; neighbouring
// threads read neighbouring columns on the GPU).
inline constexpr std::int64_t column_chunk = 64;

template <class F>
struct ColumnPartialOp {
  F f;
  std::int64_t rows, cols;
  float* partial;  // [chunks x cols]
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t chunk = static_cast<std::int64_t>(i) / cols, c = static_cast<std::int64_t>(i) % cols;
    const std::int64_t end = (chunk + 1) * column_chunk < rows ? (chunk + 1) * column_chunk : rows;
    float acc = 0.0f;
    for (std::int64_t r = chunk * column_chunk; r < end; ++r) acc += f(r, c);
    partial[i] = acc;
  }
};

struct ColumnTotalOp {
  const float* partial;
  std::int64_t chunks, cols;
  float* out;
  AMP_HOST_DEVICE void operator()(std::size_t c) const {
    double acc = 0.0;
    for (std::int64_t k = 0; k < chunks; ++k) acc += partial[k * cols + static_cast<std::int64_t>(c)];
    out[c] = static_cast<float>(acc);
  }
};
}  // namespace detail

// out[c] = sum over r of f(r, c), in fp32 partials of 64 rows summed in fp64.
template <Policy P, Backend B, class F>
void column_sums(Graph<P, B>& g, std::int64_t rows, std::int64_t cols, F f, float* out) {
  const std::int64_t chunks = (rows + detail::column_chunk - 1) / detail::column_chunk;
  float* partial = g.template scratch<float>(static_cast<std::size_t>(chunks * cols));
  for_each(g.context(), static_cast<std::size_t>(chunks * cols), detail::ColumnPartialOp<F>{f, rows, cols, partial});
  for_each(g.context(), static_cast<std::size_t>(cols), detail::ColumnTotalOp{partial, chunks, cols, out});
}

// A graph tensor's values as U: itself, or a cast copy in graph memory.
template <class U, Policy P, Backend B, class T>
const U* as_type(Graph<P, B>& g, const T* x, std::size_t n) {
  if constexpr (std::is_same_v<U, T>) {
    (void)g, (void)n;
    return x;
  } else {
    U* out = g.template scratch<U>(n);
    convert(g.context(), Span<const T>(x, n), Span<U>(out, n));
    return out;
  }
}

// Keeps the graph's memory of a scope for temporaries only: everything
// allocated inside is released at its end (allocate what outlives it before).
template <Policy P, Backend B>
class Temporaries {
 public:
  explicit Temporaries(Graph<P, B>& g) : g_(g), mark_(g.mark()) {}
  Temporaries(const Temporaries&) = delete;
  Temporaries& operator=(const Temporaries&) = delete;
  ~Temporaries() { g_.release(mark_); }

 private:
  Graph<P, B>& g_;
  std::size_t mark_;
};

}  // namespace amp::nn
