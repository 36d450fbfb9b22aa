#pragma once
// Per-policy test tolerances: a few units of the coarsest type a policy stores.
#include <algorithm>

#include "amp/policy.hpp"

namespace amp::test {

template <Policy P>
double policy_rtol() {
  const double u = std::max({unit_roundoff<typename P::param_type>, unit_roundoff<typename P::activation_type>,
                             unit_roundoff<typename P::template compute_type<op::gemm>>});
  return u <= unit_roundoff<float> ? 1e-4 : 64 * u;  // fp32: FD truncation; fp16: 3e-2; bf16: 0.25
}

}  // namespace amp::test
