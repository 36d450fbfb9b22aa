#pragma once
// What the gradient tests read from a model: each parameter as the forward
// consumed it and each gradient, in FP64 by amp's names; inputs exact in every
// storage type; and the error bound each level may show against FP64.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <type_traits>
#include <vector>

#include "amp/amp.hpp"
#include "support/reference.hpp"
#include "support/reference_nn.hpp"

namespace amp::test {

// The worst gradient error a level may show, relative to the largest gradient
// of the tensor: fp32 is limited by rounding and the FD step; fp16 and bf16 by
// their rounding through a few layers. Measured worst (2026-12-04): O0 2.2e-6,
// O1/O2 2.5e-3, O3 2.8e-3, bf16 2.1e-2; the bounds leave a factor of 2 to 9.
template <Policy P>
inline double gradient_tolerance() {
  using W = typename P::activation_type;
  if constexpr (std::is_same_v<W, float>) return 2e-5;
  else if constexpr (std::is_same_v<W, half>) return std::is_same_v<typename P::norm_param_type, half> ? 1e-2 : 6e-3;
  else return 0.04;
}

// Each parameter as the forward consumed it: weights in the GEMM/conv compute
// type (O1: the cast cache), norm parameters as stored.
template <class Store>
Params consumed_values(Store& store) {
  using P = typename std::remove_reference_t<decltype(store.template arena<nn::role::weight>())>::gemm_type;
  Params out;
  for (const auto& info : store.table()) {
    if (info.kind == nn::role::buffer) continue;
    std::vector<double> v;
    if (info.kind == nn::role::weight) {
      const nn::Param<nn::role::weight> p{info.offset, info.count, info.shape, 0};
      v = to_double(download(store.context(), store.template as<P>(p)));
    } else {
      const nn::Param<nn::role::norm> p{info.offset, info.count, info.shape, 0};
      v = to_double(download(store.context(), Span<const typename std::remove_reference_t<decltype(store.template arena<nn::role::norm>())>::stored_type>(store.values(p))));
    }
    out[info.name] = v;
  }
  return out;
}

template <class Store>
Params gradients(Store& store) {
  Params out;
  for (const auto& info : store.table()) {
    if (info.kind == nn::role::weight) {
      const nn::Param<nn::role::weight> p{info.offset, info.count, info.shape, 0};
      out[info.name] = to_double(download(store.context(), Span<const typename std::remove_reference_t<decltype(store.grads(p))>::value_type>(store.grads(p))));
    } else if (info.kind == nn::role::norm) {
      const nn::Param<nn::role::norm> p{info.offset, info.count, info.shape, 0};
      out[info.name] = to_double(download(store.context(), Span<const typename std::remove_reference_t<decltype(store.grads(p))>::value_type>(store.grads(p))));
    }
  }
  return out;
}

// Inputs exact in every storage type, so the reference sees what the model sees.
inline std::vector<float> exact_inputs(std::size_t n, std::uint32_t seed) {
  const auto b = random_values<amp::bfloat16>(n, seed, -1.5f, 1.5f);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = cast<float>(b[i]);
  return out;
}

// Each gradient in `got` against FP64 central differences of f at p: the worst
// error within tol times the tensor's largest gradient.
inline void check_against_differences(const Params& got, const Params& p, const std::function<double(const Params&)>& f,
                                      double tol) {
  for (const auto& [name, g] : got) {
    CAPTURE(name);
    Vec fd(g.size());
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      fd[i] = central_difference(f, p, name, i, 1e-6);
      scale = std::max(scale, std::abs(fd[i]));
    }
    for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - fd[i]));
    CAPTURE(scale);
    CHECK(worst <= tol * scale + 1e-12);
  }
}

}  // namespace amp::test
