// RMSNorm at a transformer's width against FP64: its output at each level,
// its one parameter (norm role: fp32 under O2) and its errors. Its gradients
// are checked against finite differences with the other layers (test_layers.cpp).
#include <doctest/doctest.h>

#include <cmath>

#include "amp/amp.hpp"
#include "support/reference_nn.hpp"

using namespace amp;

TEST_CASE_TEMPLATE("RMSNorm at width 768: x / rms(x) * weight against FP64, statistics in fp32", P, O0Policy, O2Policy,
                   O2BF16Policy, O3Policy) {
  using T = typename P::activation_type;
  constexpr std::int64_t rows = 6, d = 768;
  Context<host> ctx;
  nn::Sequential<P, host, nn::RMSNorm> model(ctx, {.max_batch = rows, .seed = 1, .inputs = {{Shape{d}}}},
                                             {.features = d, .eps = 1e-6f});
  auto& store = model.parameters();
  REQUIRE(store.table().size() == 1);  // the weight, no bias
  CHECK(store.table()[0].name == "0.weight");
  CHECK(store.table()[0].kind == nn::role::norm);
  static_assert(std::is_same_v<typename nn::RMSNorm<P, host>::N, typename P::norm_param_type>);
  std::vector<float> gamma(d), x(rows * d);
  for (std::int64_t j = 0; j < d; ++j) gamma[j] = 0.5f + 0.001f * static_cast<float>(j % 97);
  // Rows of very different scales (1e-3 .. 1e2) and a mean far from zero: what RMSNorm must not centre.
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < d; ++j)
      x[r * d + j] = cast<float>(cast<T>(static_cast<float>(std::pow(10.0, r - 3) * (1.5 + std::sin(0.1 * j + r)))));
  store.set_values(0, gamma);
  auto y = model.forward(ctx, TensorView<const float>(x.data(), Shape{rows, d}));
  std::vector<float> got;
  for (const T v : download(ctx, Span<const T>(y.var.span()))) got.push_back(cast<float>(v));
  const auto want = test::rmsnorm(test::Vec(x.begin(), x.end()), d, test::Vec(gamma.begin(), gamma.end()), 1e-6);
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (std::abs(want[i]) + 1e-3));
  // fp32: a few ulps; 16-bit: the output's own rounding (and the normalised value's, in compute_type<norm>).
  const double bound = std::is_same_v<T, float> ? 1e-5 : 3 * unit_roundoff<T>;
  CAPTURE(worst);
  CHECK(worst <= bound);
}

TEST_CASE("RMSNorm: a row that does not end in its features is refused, naming it") {
  Context<host> ctx;
  CHECK_THROWS_WITH_AS((nn::Sequential<O0Policy, host, nn::RMSNorm>(ctx, {.max_batch = 2, .inputs = {{Shape{5}}}},
                                                                    {.features = 4})),
                       doctest::Contains("RMSNorm '0.' (4 features): input [2x5] does not end in 4"), Error);
  CHECK_THROWS_WITH_AS((nn::Sequential<O0Policy, host, nn::RMSNorm>(ctx, {.max_batch = 2, .inputs = {{Shape{4}}}},
                                                                    {.features = 4, .eps = 0.0f})),
                       doctest::Contains("RMSNorm '0.': need features > 0 and eps > 0"), Error);
}
