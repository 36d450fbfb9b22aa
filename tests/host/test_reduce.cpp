#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "amp/amp.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;

TEST_CASE("host for_each visits every index once") {
  Context<host> ctx;
  std::vector<int> hits(100003, 0);
  int* p = hits.data();
  for_each(ctx, hits.size(), [=](std::size_t i) { p[i] += static_cast<int>(i % 7) + 1; });
  for (std::size_t i = 0; i < hits.size(); ++i) REQUIRE(hits[i] == static_cast<int>(i % 7) + 1);
}

TEST_CASE("host transform_reduce: sum of squares, max |x| and non-finite count in one pass") {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{300001}}) {
    CAPTURE(n);
    auto x = random_values<half>(n, 5, -3.0f, 3.0f);
    if (n > 10) x[n / 2] = cast<half>(std::numeric_limits<float>::infinity());
    double sumsq = 0, maxabs = 0;
    int bad = 0;
    for (const half v : x) {
      const double d = cast<float>(v);
      if (!std::isfinite(d)) { ++bad; continue; }
      sumsq += d * d;
      maxabs = std::max(maxabs, std::abs(d));
    }
    Context<host> ctx;
    GradStats out{};
    transform_reduce(ctx, n, amp::detail::GradStatsOf<half>{x.data()}, amp::detail::CombineGradStats{}, GradStats{}, &out);
    CHECK(out.nonfinite == bad);
    CHECK(out.maxabs == doctest::Approx(maxabs));
    CHECK(out.sumsq == doctest::Approx(sumsq).epsilon(1e-5));

    // The result does not depend on the thread count.
    Context<host> one(1);
    GradStats serial{};
    transform_reduce(one, n, amp::detail::GradStatsOf<half>{x.data()}, amp::detail::CombineGradStats{}, GradStats{}, &serial);
    CHECK(serial.sumsq == out.sumsq);
  }
}
