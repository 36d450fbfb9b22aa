#pragma once
// What the CUDA twin tests share: the GPU's and the CPU's weights after the
// same steps must agree to the level's precision.
#include <algorithm>
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

// Both start from the same bits and take `steps` Adam steps of at most
// `rate`: the drift is bounded by the precision. Adam moves a weight by about
// the rate whatever its gradient's size, so a gradient within rounding of zero
// (cuBLAS and CUB sum in another order than the CPU) may step the other way on
// the other backend: those few weights may differ by up to twice the rate a
// step, no more.
template <amp::Policy P>
void compare(const std::vector<float>& wg, const std::vector<float>& wc, int steps = 5, double rate = 0.01) {
  REQUIRE(wg.size() == wc.size());
  const double tol = steps * rate * policy_rtol<P>() + 1e-5, flipped = steps * 2 * rate + tol;
  std::size_t beyond = 0, beyond_flip = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < wg.size(); ++i) {
    const double d = std::abs(static_cast<double>(wg[i]) - wc[i]), scale = 1 + std::abs(static_cast<double>(wc[i]));
    worst = std::max(worst, d);
    beyond += d > tol * scale;
    beyond_flip += d > flipped * scale;
  }
  CAPTURE(wg.size());
  CAPTURE(worst);
  CHECK(beyond <= std::max<std::size_t>(3, wg.size() / 100));  // a few weights (1%) stepped the other way
  CHECK(beyond_flip == 0);
}

}  // namespace amp::test
