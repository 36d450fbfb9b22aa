#pragma once
// Test values on a backend: a host vector copied into a new buffer there, and a
// buffer's values read back as doubles (a sync on the GPU).
#include <vector>

#include "amp/amp.hpp"
#include "support/reference.hpp"

namespace amp::test {

template <class T, Backend B>
Buffer<T, B> on_backend(Context<B>& ctx, const std::vector<T>& v) {
  Buffer<T, B> buf(ctx, v.size(), memory_kind::workspace);
  upload(ctx, buf.span(), v);
  return buf;
}
template <class T, Backend B>
std::vector<double> values_of(Context<B>& ctx, const Buffer<T, B>& buf) {
  return to_double(download(ctx, Span<const T>(buf.data(), buf.size())));
}

}  // namespace amp::test
