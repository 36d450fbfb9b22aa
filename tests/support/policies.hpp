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

// O2-fp8 with every Linear in FP8 (none kept out as first or last) and a
// short amax history, so that small test nets run their GEMMs in FP8.
struct AllFp8Policy : O2FP8Policy {
  using fp8 = Fp8<DelayedScaling<16>, fp8_e4m3, fp8_e5m2, 0, 0>;
  static constexpr std::string_view name = "O2-fp8 (every layer)";
};
// The same under current scaling (each cast its own tensor's amax).
struct CurrentFp8Policy : AllFp8Policy {
  using fp8 = Fp8<CurrentScaling<>, fp8_e4m3, fp8_e5m2, 0, 0>;
  static constexpr std::string_view name = "O2-fp8 (current scaling)";
};

}  // namespace amp::test
