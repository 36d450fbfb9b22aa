#pragma once
// Backend-independent element-wise helpers built on for_each: the functors are
// AMP_HOST_DEVICE, so the same code fills and converts on the CPU and the GPU.
#include "amp/core/error.hpp"
#include "amp/core/numeric.hpp"
#include "amp/core/span.hpp"

namespace amp {

namespace detail {
template <class T>
struct FillOp {
  T* out;
  T value;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { out[i] = value; }
};

template <class From, class To>
struct ConvertOp {
  const From* in;
  To* out;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { out[i] = cast<To>(in[i]); }
};
}  // namespace detail

template <class Ctx, class T>
void fill(Ctx& ctx, Span<T> out, T value) {
  for_each(ctx, out.size, detail::FillOp<T>{out.data, value});
}

// out[i] = cast<To>(in[i]), one rounding.
template <class Ctx, class From, class To>
void convert(Ctx& ctx, Span<const From> in, Span<To> out) {
  AMP_REQUIRE(in.size == out.size, "convert: ", in.size, " elements into ", out.size);
  for_each(ctx, in.size, detail::ConvertOp<From, To>{in.data, out.data});
}

}  // namespace amp
