#pragma once
// An FP64 reference of the layers and losses, evaluated on the weights a model
// holds: forward values to compare against, and finite differences of its loss
// to check the model's gradients.
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace amp::test {

enum class act { none, relu, gelu, tanh, sigmoid };
enum class loss_kind { mse, cross_entropy, bce };

inline double act_fwd(act a, double x) {
  switch (a) {
    case act::relu: return x > 0 ? x : 0;
    case act::gelu: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / 3.141592653589793) * (x + 0.044715 * x * x * x)));
    case act::tanh: return std::tanh(x);
    case act::sigmoid: return 1 / (1 + std::exp(-x));
    default: return x;
  }
}

// Linear(in -> hidden) [bias], act, Linear(hidden -> out) [bias]; weights
// read from a flat vector at the given offsets.
struct RefMlp {
  std::int64_t in, hidden, out;
  act activation;
  std::size_t w1, b1, w2, b2;  // offsets into the flat parameter vector

  std::vector<double> forward(const std::vector<double>& p, const std::vector<double>& x, std::int64_t rows) const {
    std::vector<double> y(static_cast<std::size_t>(rows * out));
    std::vector<double> h(static_cast<std::size_t>(hidden));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < hidden; ++j) {
        double acc = p[b1 + j];
        for (std::int64_t i = 0; i < in; ++i) acc += x[r * in + i] * p[w1 + j * in + i];
        h[j] = act_fwd(activation, acc);
      }
      for (std::int64_t k = 0; k < out; ++k) {
        double acc = p[b2 + k];
        for (std::int64_t j = 0; j < hidden; ++j) acc += h[j] * p[w2 + k * hidden + j];
        y[r * out + k] = acc;
      }
    }
    return y;
  }

  static double loss(loss_kind kind, const std::vector<double>& y, const std::vector<double>& target,
                     const std::vector<std::int32_t>& labels, std::int64_t rows, std::int64_t cols) {
    double total = 0;
    if (kind == loss_kind::cross_entropy) {
      for (std::int64_t r = 0; r < rows; ++r) {
        double m = y[r * cols];
        for (std::int64_t c = 1; c < cols; ++c) m = std::max(m, y[r * cols + c]);
        double s = 0;
        for (std::int64_t c = 0; c < cols; ++c) s += std::exp(y[r * cols + c] - m);
        total += m + std::log(s) - y[r * cols + labels[r]];
      }
      return total / static_cast<double>(rows);
    }
    for (std::size_t i = 0; i < y.size(); ++i) {
      const double v = y[i], t = target[i];
      total += kind == loss_kind::mse ? (v - t) * (v - t) : std::max(v, 0.0) - v * t + std::log1p(std::exp(-std::abs(v)));
    }
    return total / static_cast<double>(y.size());
  }
};

// Central difference of f at p[i], in FP64.
inline double central_difference(const std::function<double(const std::vector<double>&)>& f, std::vector<double> p,
                                 std::size_t i, double h) {
  const double keep = p[i];
  p[i] = keep + h;
  const double up = f(p);
  p[i] = keep - h;
  const double down = f(p);
  return (up - down) / (2 * h);
}

}  // namespace amp::test
