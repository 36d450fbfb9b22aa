#pragma once
// Building blocks the layers share: element-wise functors written once for
// both backends (math in fp32, one rounding into the stored type), the
// gradient-accumulation rule, typed casts between graph tensors, and per-column
// sums in graph scratch.
#include <cstdint>
#include <type_traits>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/column_sums.hpp"
#include "amp/core/activation.hpp"
#include "amp/model/graph.hpp"
#include "amp/model/graph_hooks.hpp"

namespace amp::nn {

namespace detail {
// f(std::true_type{}) or f(std::false_type{}): a flag fixed for a whole work
// item becomes a constant inside f, so its inner loops have no branch on it and vectorise.
template <class F>
AMP_HOST_DEVICE inline void with_flag(bool flag, F f) {
  if (flag) f(std::true_type{});
  else f(std::false_type{});
}

// The output coordinate o with o * stride == at and 0 <= o < size, if there is
// one: which window of a strided op (conv, pool) has its tap at input position
// `at`. No division at stride 1, the common case.
AMP_HOST_DEVICE inline bool output_at(std::int64_t at, std::int64_t stride, std::int64_t size, std::int64_t& o) {
  if (at < 0) return false;
  if (stride == 1) {
    o = at;
  } else {
    if (at % stride != 0) return false;
    o = at / stride;
  }
  return o < size;
}

// A gradient contribution: written the first time, added afterwards.
template <class T>
AMP_HOST_DEVICE inline void store_grad(T* out, std::size_t i, float v, bool accumulate) {
  out[i] = cast<T>(accumulate ? cast<float>(out[i]) + v : v);
}

// grad[i] += d[i], an fp32 sum added with one rounding.
template <class GW>
struct AddGradFromFloatOp {
  const float* d;
  GW* grad;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { store_grad(grad, i, d[i], true); }
};

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

// dx (+)= weight * dy, for ops whose backward passes a gradient through (dx may be dy;
// dy of another type: a cast's backward).
template <class T, class D = T>
struct AddGradOp {
  const D* dy;
  T* dx;
  bool accumulate;
  float weight = 1.0f;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { store_grad(dx, i, weight * cast<float>(dy[i]), accumulate); }
};

using amp::detail::ValueAt;
}  // namespace detail

// out[c] = sum over r of f(r, c) (backend/column_sums.hpp), partials in graph scratch.
template <Policy P, Backend B, class F>
void column_sums(Graph<P, B>& g, std::int64_t rows, std::int64_t cols, F f, float* out) {
  float* partial = g.template scratch<float>(column_sum_partials(rows, cols));
  amp::column_sums(g.context(), rows, cols, f, partial, out);
}

// dL/dz for y = act(z): dy through a fused activation (relu, or gelu from its
// pre-activation), into graph scratch, in the pointwise compute type of the
// layer's policy Q; dy itself when there is none.
template <Policy Q, Policy P, Backend B, class T>
const T* through_activation(Graph<P, B>& g, activation act, Var<T> y, const T* pre, const T* dy) {
  if (act == activation::none) return dy;
  T* buf = g.template scratch<T>(y.size());
  using C = typename Q::template compute_type<op::pointwise>;
  if (act == activation::relu)
    for_each(g.context(), y.size(), detail::ActivationGradOp<ReluFn, C, T>{nullptr, y.data, dy, buf, false});
  else
    for_each(g.context(), y.size(), detail::ActivationGradOp<GeluFn, C, T>{pre, y.data, dy, buf, false});
  return buf;
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

// x as U on the tape: x itself when it is U, else a copy rounded once, whose
// gradient flows back to x converted (a layer's boundary under its own policy).
// Its backward reads dy alone: a fused loss may write over the copy.
template <class U, Policy P, Backend B, class T>
Var<U> to_type(Graph<P, B>& g, Var<T> x) {
  if constexpr (std::is_same_v<U, T>) {
    return x;
  } else {
    Var<U> y = g.template tensor<U>(x.shape, x.id >= 0);
    convert(g.context(), Span<const T>(x.data, x.size()), y.span());
    if (x.id >= 0)
      g.on_backward([=](Graph<P, B>& gb) {
        const U* dy = gb.grad(y);
        if (!dy) return;
        if (const GradOut<T> dx = gb.grad_out(x))
          for_each(gb.context(), x.size(), detail::AddGradOp<T, U>{dy, dx.data, dx.accumulate});
      });
    detail::GraphHooks::allow_overwrite(g, y);
    return y;
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
  typename Graph<P, B>::Mark mark_;
};

}  // namespace amp::nn
