#pragma once
// What the CUDA twin tests share: the GPU's and the CPU's weights after the
// same steps must agree to the level's precision.
#include <cmath>
#include <vector>

#include <doctest/doctest.h>

#include "amp/policy.hpp"
#include "support/policies.hpp"

namespace amp::test {

// Every parameter of the model, as fp32 values in table order.
template <class Model>
std::vector<float> all_values(Model& model) {
  std::vector<float> all;
  for (std::size_t i = 0; i < model.parameters().table().size(); ++i) {
    const auto v = model.parameters().get_values(static_cast<int>(i));
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// Both start from the same bits; 5 Adam steps of 0.01 bound the drift by the precision.
template <amp::Policy P>
void compare(const std::vector<float>& wg, const std::vector<float>& wc) {
  REQUIRE(wg.size() == wc.size());
  const double tol = 5 * 0.01 * policy_rtol<P>() + 1e-5;
  for (std::size_t i = 0; i < wg.size(); ++i) REQUIRE(std::abs(wg[i] - wc[i]) <= tol);
}

}  // namespace amp::test
