#pragma once
// An FP64 reference of amp's layers and losses: plain loops over channels-last
// tensors, written from the definitions (not from amp's code), to check amp's
// forward values and, through central differences, its gradients.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace amp::test {

using Vec = std::vector<double>;
using Params = std::map<std::string, Vec>;  // by amp's parameter names

inline double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / 3.141592653589793) * (x + 0.044715 * x * x * x))); }
inline double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

inline Vec map(const Vec& x, double (*f)(double)) {
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = f(x[i]);
  return y;
}
inline double relu(double x) { return x > 0 ? x : 0; }
inline double tanh_(double x) { return std::tanh(x); }

// x [rows, in] W [out, in] b [out] -> [rows, out]
inline Vec linear(const Vec& x, std::int64_t in, const Vec& w, const Vec& b, std::int64_t out) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / in;
  Vec y(static_cast<std::size_t>(rows * out));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (std::int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[o * in + i];
      y[r * out + o] = acc;
    }
  return y;
}

struct Image {
  std::int64_t n, h, w, c;
};

// x [N, H, W, C], W [K, C, k, k] -> [N, Ho, Wo, K]
inline Vec conv2d(const Vec& x, Image s, const Vec& w, const Vec& b, std::int64_t k_out, std::int64_t k,
                  std::int64_t stride, std::int64_t pad, std::int64_t dil, Image* out_shape) {
  const std::int64_t span = dil * (k - 1) + 1, ho = (s.h + 2 * pad - span) / stride + 1, wo = (s.w + 2 * pad - span) / stride + 1;
  Vec y(static_cast<std::size_t>(s.n * ho * wo * k_out));
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t oh = 0; oh < ho; ++oh)
      for (std::int64_t ow = 0; ow < wo; ++ow)
        for (std::int64_t o = 0; o < k_out; ++o) {
          double acc = b.empty() ? 0.0 : b[o];
          for (std::int64_t c = 0; c < s.c; ++c)
            for (std::int64_t r = 0; r < k; ++r)
              for (std::int64_t q = 0; q < k; ++q) {
                const std::int64_t h = oh * stride - pad + r * dil, ww = ow * stride - pad + q * dil;
                if (h < 0 || h >= s.h || ww < 0 || ww >= s.w) continue;
                acc += x[((n * s.h + h) * s.w + ww) * s.c + c] * w[((o * s.c + c) * k + r) * k + q];
              }
          y[((n * ho + oh) * wo + ow) * k_out + o] = acc;
        }
  *out_shape = {s.n, ho, wo, k_out};
  return y;
}

// Per-column (channel) batch normalisation over every row, biased variance.
inline Vec batchnorm(const Vec& x, std::int64_t c, const Vec& gamma, const Vec& beta, double eps) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / c;
  Vec y(x.size());
  for (std::int64_t j = 0; j < c; ++j) {
    double mean = 0, var = 0;
    for (std::int64_t r = 0; r < rows; ++r) mean += x[r * c + j];
    mean /= static_cast<double>(rows);
    for (std::int64_t r = 0; r < rows; ++r) var += (x[r * c + j] - mean) * (x[r * c + j] - mean);
    var /= static_cast<double>(rows);
    for (std::int64_t r = 0; r < rows; ++r) y[r * c + j] = (x[r * c + j] - mean) / std::sqrt(var + eps) * gamma[j] + beta[j];
  }
  return y;
}

inline Vec layernorm(const Vec& x, std::int64_t d, const Vec& gamma, const Vec& beta, double eps) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / d;
  Vec y(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t j = 0; j < d; ++j) mean += x[r * d + j];
    mean /= static_cast<double>(d);
    for (std::int64_t j = 0; j < d; ++j) var += (x[r * d + j] - mean) * (x[r * d + j] - mean);
    var /= static_cast<double>(d);
    for (std::int64_t j = 0; j < d; ++j) y[r * d + j] = (x[r * d + j] - mean) / std::sqrt(var + eps) * gamma[j] + beta[j];
  }
  return y;
}

// Apex's FusedRMSNorm: x / sqrt(mean(x^2) + eps) * gamma per row of d.
inline Vec rmsnorm(const Vec& x, std::int64_t d, const Vec& gamma, double eps) {
  Vec y(x.size());
  for (std::size_t r = 0; r < x.size() / static_cast<std::size_t>(d); ++r) {
    double sq = 0;
    for (std::int64_t j = 0; j < d; ++j) sq += x[r * d + j] * x[r * d + j];
    for (std::int64_t j = 0; j < d; ++j) y[r * d + j] = x[r * d + j] / std::sqrt(sq / static_cast<double>(d) + eps) * gamma[j];
  }
  return y;
}

inline Vec pool(const Vec& x, Image s, std::int64_t k, std::int64_t stride, std::int64_t pad, bool max, Image* out) {
  const std::int64_t ho = (s.h + 2 * pad - k) / stride + 1, wo = (s.w + 2 * pad - k) / stride + 1;
  Vec y(static_cast<std::size_t>(s.n * ho * wo * s.c));
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t oh = 0; oh < ho; ++oh)
      for (std::int64_t ow = 0; ow < wo; ++ow)
        for (std::int64_t c = 0; c < s.c; ++c) {
          double acc = max ? -INFINITY : 0.0;
          for (std::int64_t r = 0; r < k; ++r)
            for (std::int64_t q = 0; q < k; ++q) {
              const std::int64_t h = oh * stride - pad + r, w = ow * stride - pad + q;
              if (h < 0 || h >= s.h || w < 0 || w >= s.w) continue;
              const double v = x[((n * s.h + h) * s.w + w) * s.c + c];
              acc = max ? std::max(acc, v) : acc + v;
            }
          y[((n * ho + oh) * wo + ow) * s.c + c] = max ? acc : acc / static_cast<double>(k * k);
        }
  *out = {s.n, ho, wo, s.c};
  return y;
}

inline Vec global_avg(const Vec& x, Image s) {
  Vec y(static_cast<std::size_t>(s.n * s.c), 0.0);
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t p = 0; p < s.h * s.w; ++p)
      for (std::int64_t c = 0; c < s.c; ++c) y[n * s.c + c] += x[(n * s.h * s.w + p) * s.c + c] / static_cast<double>(s.h * s.w);
  return y;
}

// [N, H, W, C] -> [N, C*H*W] in (c, h, w) order, as PyTorch flattens NCHW.
inline Vec flatten(const Vec& x, Image s) {
  Vec y(x.size());
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c)
      for (std::int64_t p = 0; p < s.h * s.w; ++p) y[(n * s.c + c) * s.h * s.w + p] = x[(n * s.h * s.w + p) * s.c + c];
  return y;
}

inline Vec add(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

inline Vec concat(const Vec& a, std::int64_t ca, const Vec& b, std::int64_t cb) {
  const std::int64_t rows = static_cast<std::int64_t>(a.size()) / ca;
  Vec y(static_cast<std::size_t>(rows * (ca + cb)));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < ca; ++j) y[r * (ca + cb) + j] = a[r * ca + j];
    for (std::int64_t j = 0; j < cb; ++j) y[r * (ca + cb) + ca + j] = b[r * cb + j];
  }
  return y;
}

// qkv [n*t, 3c] (q | k | v; head h owns columns h*d .. h*d+d-1 of each) -> [n*t, c]:
// per head, softmax(q k^T / sqrt(d)) v over the keys up to the query (causal).
inline Vec causal_attention(const Vec& qkv, std::int64_t n, std::int64_t t, std::int64_t c, std::int64_t heads) {
  const std::int64_t d = c / heads;
  const auto at = [&](std::int64_t b, std::int64_t i, std::int64_t part, std::int64_t h, std::int64_t e) {
    return qkv[static_cast<std::size_t>((b * t + i) * 3 * c + part * c + h * d + e)];
  };
  Vec y(static_cast<std::size_t>(n * t * c));
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < t; ++i) {
        Vec s(static_cast<std::size_t>(i + 1));
        double m = -1e300, sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t e = 0; e < d; ++e) dot += at(b, i, 0, h, e) * at(b, j, 1, h, e);
          s[j] = dot / std::sqrt(static_cast<double>(d));
          m = std::max(m, s[j]);
        }
        for (auto& v : s) sum += (v = std::exp(v - m));
        for (std::int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (std::int64_t j = 0; j <= i; ++j) acc += s[j] / sum * at(b, j, 2, h, e);
          y[static_cast<std::size_t>((b * t + i) * c + h * d + e)] = acc;
        }
      }
  return y;
}

inline double mse(const Vec& p, const Vec& t) {
  double s = 0;
  for (std::size_t i = 0; i < p.size(); ++i) s += (p[i] - t[i]) * (p[i] - t[i]);
  return s / static_cast<double>(p.size());
}

inline double cross_entropy(const Vec& x, std::int64_t classes, const std::vector<std::int32_t>& labels) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / classes;
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = x[r * classes];
    for (std::int64_t c = 1; c < classes; ++c) m = std::max(m, x[r * classes + c]);
    double s = 0;
    for (std::int64_t c = 0; c < classes; ++c) s += std::exp(x[r * classes + c] - m);
    total += m + std::log(s) - x[r * classes + labels[static_cast<std::size_t>(r)]];
  }
  return total / static_cast<double>(rows);
}

inline double bce(const Vec& x, const Vec& t) {
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) s += std::max(x[i], 0.0) - x[i] * t[i] + std::log1p(std::exp(-std::abs(x[i])));
  return s / static_cast<double>(x.size());
}

// Central difference of f at p[name][i], in FP64.
inline double central_difference(const std::function<double(const Params&)>& f, Params p, const std::string& name,
                                 std::size_t i, double h) {
  const double keep = p[name][i];
  p[name][i] = keep + h;
  const double up = f(p);
  p[name][i] = keep - h;
  const double down = f(p);
  return (up - down) / (2 * h);
}

}  // namespace amp::test
