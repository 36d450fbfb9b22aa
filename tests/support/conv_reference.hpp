#pragma once
// The library convolution's three passes (backend/conv.hpp) on backend B
// against a direct FP64 convolution: the host's oneDNN and the GPU's cuDNN
// are held to the same bounds.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "amp/amp.hpp"
#include "support/backend_values.hpp"
#include "support/reference.hpp"

namespace amp::test {

inline ConvGeometry conv_geometry(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k,
                                  std::int64_t kernel, std::int64_t stride, std::int64_t pad, std::int64_t dilation) {
  const std::int64_t span = dilation * (kernel - 1) + 1;
  return {n, h, w, c, k, kernel, kernel, stride, pad, dilation, (h + 2 * pad - span) / stride + 1,
          (w + 2 * pad - span) / stride + 1};
}

// The shapes every backend's library convolution is checked on.
inline std::vector<ConvGeometry> conv_cases() {
  return {conv_geometry(2, 7, 7, 1, 8, 3, 1, 1, 1),     // a first layer on grey images
          conv_geometry(3, 9, 8, 16, 32, 3, 1, 1, 1),   // the CNN's middle layer, smaller
          conv_geometry(2, 11, 11, 5, 7, 3, 2, 1, 1),   // stride 2, odd channel counts
          conv_geometry(2, 10, 10, 4, 6, 3, 2, 1, 1),   // stride 2, even size
          conv_geometry(1, 12, 12, 8, 8, 3, 1, 2, 2),   // dilation 2
          conv_geometry(4, 5, 5, 24, 16, 1, 1, 0, 1),   // 1x1
          conv_geometry(2, 6, 6, 3, 5, 5, 1, 0, 1)};    // 5x5, no padding
}

// Calls f(n, oh, ow, k, h, w, c, r, s) for every tap that reads inside the image.
template <class F>
void for_each_tap(const ConvGeometry& g, F f) {
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t oh = 0; oh < g.ho; ++oh)
      for (std::int64_t ow = 0; ow < g.wo; ++ow)
        for (std::int64_t r = 0; r < g.kh; ++r)
          for (std::int64_t s = 0; s < g.kw; ++s) {
            const std::int64_t h = oh * g.stride - g.pad + r * g.dilation, w = ow * g.stride - g.pad + s * g.dilation;
            if (h < 0 || h >= g.h || w < 0 || w >= g.w) continue;
            for (std::int64_t k = 0; k < g.k; ++k)
              for (std::int64_t c = 0; c < g.c; ++c) f(n, oh, ow, k, h, w, c, r, s);
          }
}

// Forward (with or without bias), the input gradient in T and in fp32, the
// filter and bias gradients, each within fp32 summation error (terms summed)
// plus one rounding into T.
template <class T, Backend B>
void check_conv_passes(Context<B>& ctx, const ConvGeometry& g, bool bias, std::uint32_t seed) {
  const std::vector<std::int64_t> shape{g.n, g.h, g.w, g.c, g.k, g.kh, g.stride, g.pad, g.dilation};
  CAPTURE(shape);
  CAPTURE(bias);
  REQUIRE(conv_available<T>(ctx, g, bias));
  const auto x = random_values<T>(static_cast<std::size_t>(g.n * g.h * g.w * g.c), seed);
  const auto wt = random_values<T>(static_cast<std::size_t>(g.k * g.c * g.kh * g.kw), seed + 1);
  const auto b = random_values<T>(static_cast<std::size_t>(g.k), seed + 2);
  const auto dy = random_values<T>(static_cast<std::size_t>(g.pixels() * g.k), seed + 3);
  const auto xi = [&](auto n, auto h, auto w, auto c) { return ((n * g.h + h) * g.w + w) * g.c + c; };
  const auto yi = [&](auto n, auto oh, auto ow, auto k) { return ((n * g.ho + oh) * g.wo + ow) * g.k + k; };
  const auto wi = [&](auto k, auto c, auto r, auto s) { return ((k * g.c + c) * g.kh + r) * g.kw + s; };

  std::vector<double> y_ref(dy.size(), 0.0), dx_ref(x.size(), 0.0), dw_ref(wt.size(), 0.0), db_ref(b.size(), 0.0);
  for_each_tap(g, [&](auto n, auto oh, auto ow, auto k, auto h, auto w, auto c, auto r, auto s) {
    const double xv = cast<float>(x[xi(n, h, w, c)]), wv = cast<float>(wt[wi(k, c, r, s)]);
    const double d = cast<float>(dy[yi(n, oh, ow, k)]);
    y_ref[yi(n, oh, ow, k)] += xv * wv;
    dx_ref[xi(n, h, w, c)] += d * wv;
    dw_ref[wi(k, c, r, s)] += d * xv;
  });
  for (std::size_t i = 0; i < dy.size(); ++i) {
    if (bias) y_ref[i] += cast<float>(b[i % b.size()]);
    db_ref[i % b.size()] += cast<float>(dy[i]);
  }

  // The passes read the filter channels-last, [K, kh, kw, C]; dw comes back as stored, [K, C, kh, kw].
  std::vector<T> taps(wt.size());
  for (std::int64_t k = 0; k < g.k; ++k)
    for (std::int64_t c = 0; c < g.c; ++c)
      for (std::int64_t r = 0; r < g.kh; ++r)
        for (std::int64_t s = 0; s < g.kw; ++s) taps[((k * g.kh + r) * g.kw + s) * g.c + c] = wt[wi(k, c, r, s)];
  const auto dev_x = on_backend(ctx, x), dev_w = on_backend(ctx, taps), dev_b = on_backend(ctx, b),
             dev_dy = on_backend(ctx, dy);
  Buffer<T, B> y(ctx, dy.size(), memory_kind::workspace), dx(ctx, x.size(), memory_kind::workspace);
  Buffer<float, B> dx32(ctx, x.size(), memory_kind::workspace), dw(ctx, wt.size(), memory_kind::workspace),
      db(ctx, b.size(), memory_kind::workspace);
  conv_forward(ctx, g, dev_x.data(), dev_w.data(), bias ? dev_b.data() : nullptr, y.data());
  conv_backward_data(ctx, g, dev_dy.data(), dev_w.data(), dx.data(), bias);
  conv_backward_data(ctx, g, dev_dy.data(), dev_w.data(), dx32.data(), bias);
  conv_backward_weights(ctx, g, dev_x.data(), dev_dy.data(), dw.data(), bias ? db.data() : nullptr);

  // |terms| <= 1: the fp32 sums' error grows with the terms summed; T's rounding once.
  const auto rtol = [](std::int64_t terms, double out_roundoff) {
    return 4.0 * static_cast<double>(terms) * unit_roundoff<float> + 2.0 * out_roundoff;
  };
  const double window = static_cast<double>(g.window()) + 1, per_input = static_cast<double>(g.k * g.kh * g.kw);
  const auto pixels = g.pixels();
  CHECK(worst_error_ratio(values_of(ctx, y), y_ref, 0.0, rtol(g.window() + 1, unit_roundoff<T>) * window) <= 1.0);
  CHECK(worst_error_ratio(values_of(ctx, dx), dx_ref, 0.0, rtol(g.k * g.kh * g.kw, unit_roundoff<T>) * per_input) <=
        1.0);
  CHECK(worst_error_ratio(values_of(ctx, dx32), dx_ref, 0.0, rtol(g.k * g.kh * g.kw, 0.0) * per_input) <= 1.0);
  CHECK(worst_error_ratio(values_of(ctx, dw), dw_ref, 0.0, rtol(pixels, 0.0) * static_cast<double>(pixels)) <= 1.0);
  if (bias)
    CHECK(worst_error_ratio(values_of(ctx, db), db_ref, 0.0, rtol(pixels, 0.0) * static_cast<double>(pixels)) <= 1.0);
}

}  // namespace amp::test
