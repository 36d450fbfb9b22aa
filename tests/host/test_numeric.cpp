#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "amp/core/activation.hpp"
#include "amp/core/numeric.hpp"
#include "amp/core/traits.hpp"

using amp::half;
using amp::detail::bits;
using amp::detail::float_bits;

namespace {
std::uint16_t h(float f) { return bits(amp::cast<half>(f)); }
std::uint16_t b(float f) { return bits(amp::cast<amp::bfloat16>(f)); }
float f_of(std::uint32_t u) { return amp::detail::bits_float(u); }
}  // namespace

TEST_CASE("half casts round to nearest even at ties") {
  CHECK(h(1.0f) == 0x3c00);
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties to the even mantissa (1.0).
  CHECK(h(1.0f + 0x1p-11f) == 0x3c00);
  // 1 + 3*2^-11 lies halfway between 1+2^-10 (odd) and 1+2^-9 (even): rounds up.
  CHECK(h(1.0f + 3 * 0x1p-11f) == 0x3c02);
  // Just above the tie rounds up.
  CHECK(h(std::nextafter(1.0f + 0x1p-11f, 2.0f)) == 0x3c01);
  CHECK(h(-2.0f) == 0xc000);
  CHECK(h(0.0f) == 0x0000);
  CHECK(h(-0.0f) == 0x8000);
}

TEST_CASE("half casts overflow to inf and keep NaN") {
  CHECK(h(65504.0f) == 0x7bff);                 // largest finite
  CHECK(h(65519.99f) == 0x7bff);                // below the tie with 65536
  CHECK(h(65520.0f) == 0x7c00);                 // the tie rounds to even: inf
  CHECK(h(1e6f) == 0x7c00);
  CHECK(h(-1e6f) == 0xfc00);
  CHECK(h(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK((h(std::numeric_limits<float>::quiet_NaN()) & 0x7c00) == 0x7c00);
  CHECK((h(std::numeric_limits<float>::quiet_NaN()) & 0x03ff) != 0);
}

TEST_CASE("half subnormals and underflow") {
  CHECK(h(0x1p-24f) == 0x0001);                 // smallest subnormal
  CHECK(h(0x1p-25f) == 0x0000);                 // tie between 0 and 2^-24: even is 0
  CHECK(h(0x1.8p-24f) == 0x0002);               // 1.5 * 2^-24: tie, rounds to even (2)
  CHECK(h(0x1p-14f) == 0x0400);                 // smallest normal
  CHECK(amp::cast<float>(amp::detail::half_from_bits(0x0001)) == 0x1p-24f);
  CHECK(amp::cast<float>(amp::detail::half_from_bits(0x83ff)) == -1023 * 0x1p-24f);
}

TEST_CASE("half host casts agree with CUDA's reference conversion on every bit pattern") {
  // Every half converts to float and back to itself.
  for (std::uint32_t x = 0; x < 0x10000; ++x) {
    const half v = amp::detail::half_from_bits(static_cast<std::uint16_t>(x));
    const float f = amp::cast<float>(v);
    if (std::isnan(f)) {  // NaN payloads are not part of the contract (CUDA's host twin canonicalises them)
      REQUIRE(std::isnan(__half2float(v)));
      continue;
    }
    REQUIRE(float_bits(f) == float_bits(__half2float(v)));
    REQUIRE(float_bits(amp::detail::half_bits_to_float_soft(static_cast<std::uint16_t>(x))) == float_bits(f));
    REQUIRE(bits(amp::cast<half>(f)) == x);
  }
  // Random floats around the half range, including ties, match CUDA's own host rounding.
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::uint32_t> dist(0x30000000u, 0x47900000u);
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = dist(gen);
    if (i % 4 == 0) u = (u & ~0x1fffu) | 0x1000u;  // exact ties for the half mantissa
    const float f = f_of(u) * (i % 2 ? -1.0f : 1.0f);
    REQUIRE(h(f) == bits(__float2half_rn(f)));
    REQUIRE(amp::detail::float_to_half_bits_soft(f) == h(f));  // the twin for compilers without _Float16
  }
}

TEST_CASE("amp::bfloat16 casts round to nearest even and overflow to inf") {
  CHECK(b(1.0f) == 0x3f80);
  CHECK(b(f_of(0x3f808000u)) == 0x3f80);        // tie, even
  CHECK(b(f_of(0x3f818000u)) == 0x3f82);        // tie, odd -> up
  CHECK(b(f_of(0x3f808001u)) == 0x3f81);
  CHECK(b(f_of(0x7f7fffffu)) == 0x7f80);        // fp32 max rounds to inf in bf16
  CHECK(b(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(std::isnan(amp::cast<float>(amp::cast<amp::bfloat16>(std::numeric_limits<float>::quiet_NaN()))));
  std::mt19937 gen(11);
  for (int i = 0; i < 200000; ++i) {
    const float f = f_of(gen());
    if (std::isnan(f)) continue;
    REQUIRE(b(f) == bits(__float2bfloat16_rn(f)));
  }
}

TEST_CASE("numeric limits") {
  CHECK(amp::cast<float>(amp::limits<half>::max()) == 65504.0f);
  CHECK(amp::cast<float>(amp::limits<half>::epsilon()) == 0x1p-10f);
  CHECK(amp::cast<float>(amp::limits<half>::min_normal()) == 0x1p-14f);
  CHECK(amp::cast<float>(amp::limits<amp::bfloat16>::max()) == f_of(0x7f7f0000u));
  CHECK(amp::cast<float>(amp::limits<amp::bfloat16>::epsilon()) == 0x1p-7f);
  CHECK(amp::cast<float>(amp::limits<amp::bfloat16>::min_normal()) == std::numeric_limits<float>::min());
  CHECK(amp::limits<float>::max() == std::numeric_limits<float>::max());
  CHECK(amp::limits<float>::epsilon() == std::numeric_limits<float>::epsilon());
  CHECK(amp::limits<float>::min_normal() == std::numeric_limits<float>::min());
  CHECK(amp::unit_roundoff<half> == 0x1p-11);
  CHECK(amp::type_name<half>() == "fp16");
  CHECK(!amp::is_finite(std::numeric_limits<float>::infinity()));
  CHECK(!amp::is_finite(std::numeric_limits<float>::quiet_NaN()));
  CHECK(amp::is_finite(3.0e38f));
}

TEST_CASE("exp_poly and tanh_poly (the softmax's and GELU's branch-free forms) against FP64") {
  double worst_exp = 0, worst_tanh = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 200000.0f;
    const double want = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::abs(amp::detail::exp_poly(x) - want) / want);
    const float u = -12.0f + 24.0f * static_cast<float>(i) / 200000.0f;
    worst_tanh = std::max(worst_tanh, std::abs(amp::detail::tanh_poly(u) - std::tanh(static_cast<double>(u))));
  }
  CHECK(worst_exp < 2.5e-7);  // ~2 ulp of fp32
  CHECK(worst_tanh < 2e-7);
  CHECK(amp::detail::exp_poly(-1000.0f) == amp::detail::exp_poly(-87.0f));  // clamped: tiny, never 0 or NaN
  CHECK(std::isfinite(amp::detail::exp_poly(1000.0f)));
  CHECK(amp::detail::exp_poly(0.0f) == 1.0f);
}
