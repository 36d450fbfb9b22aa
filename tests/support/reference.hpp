#pragma once
// Test helpers: seeded data and FP64 references to check the library against.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "amp/core/numeric.hpp"
#include "amp/core/span.hpp"

namespace amp::test {

// Uniform values in [lo, hi), already representable in T (so references see what the library sees).
template <class T>
std::vector<T> random_values(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> out(n);
  for (auto& x : out) x = cast<T>(dist(gen));
  return out;
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = cast<float>(v[i]);
  return out;
}

// Row-major FP64 C = alpha op(A) op(B) + beta C.
inline void reference_gemm(const std::vector<double>& a, bool ta, const std::vector<double>& b, bool tb,
                           std::vector<double>& c, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                           double beta) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double x = ta ? a[p * m + i] : a[i * k + p];
        const double y = tb ? b[j * k + p] : b[p * n + j];
        acc += x * y;
      }
      c[i * n + j] = alpha * acc + beta * c[i * n + j];
    }
}

// Largest |x - ref| / (atol + |ref|) * ... : returns the worst excess over tolerance (<= 1 passes).
inline double worst_error_ratio(const std::vector<double>& got, const std::vector<double>& ref, double rtol,
                                double atol) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - ref[i]) / (atol + rtol * std::abs(ref[i]));
    if (!(err <= worst)) worst = err;  // NaN counts as worst
  }
  return worst;
}

}  // namespace amp::test
