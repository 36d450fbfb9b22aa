// The library convolution (oneDNN on the host) against a direct FP64
// convolution, pass by pass, and amp's binding of oneDNN's C API against <dnnl.h>.
#include <doctest/doctest.h>

#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <string>
#include <vector>

#include "amp/amp.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;

namespace {

namespace v = amp::detail::onednn::value;
static_assert(v::unimplemented == dnnl_unimplemented && v::cpu == dnnl_cpu && v::in_order == dnnl_stream_default_flags);
static_assert(v::f32 == dnnl_f32 && v::bf16 == dnnl_bf16);
static_assert(v::any == dnnl_format_tag_any && v::nhwc == dnnl_nhwc && v::oihw == dnnl_oihw && v::x == dnnl_x);
static_assert(v::forward_training == dnnl_forward_training && v::backward_data == dnnl_backward_data &&
              v::backward_weights == dnnl_backward_weights && v::convolution_direct == dnnl_convolution_direct);
static_assert(v::scratchpad_user == dnnl_scratchpad_mode_user && v::query_scratchpad_md == dnnl_query_scratchpad_md &&
              v::query_exec_arg_md == dnnl_query_exec_arg_md && v::query_impl_info_str == dnnl_query_impl_info_str);
static_assert(v::arg_src == DNNL_ARG_SRC && v::arg_dst == DNNL_ARG_DST && v::arg_weights == DNNL_ARG_WEIGHTS &&
              v::arg_bias == DNNL_ARG_BIAS && v::arg_scratchpad == DNNL_ARG_SCRATCHPAD &&
              v::arg_diff_src == DNNL_ARG_DIFF_SRC && v::arg_diff_dst == DNNL_ARG_DIFF_DST &&
              v::arg_diff_weights == DNNL_ARG_DIFF_WEIGHTS && v::arg_diff_bias == DNNL_ARG_DIFF_BIAS);
static_assert(sizeof(amp::detail::onednn::memory_desc) >= sizeof(dnnl_memory_desc_t) &&
              alignof(amp::detail::onednn::memory_desc) >= alignof(dnnl_memory_desc_t));
static_assert(sizeof(amp::detail::onednn::op_desc) >= sizeof(dnnl_convolution_desc_t) &&
              alignof(amp::detail::onednn::op_desc) >= alignof(dnnl_convolution_desc_t));
static_assert(sizeof(amp::detail::onednn::dims) == sizeof(dnnl_dims_t));
static_assert(sizeof(amp::detail::onednn::exec_arg) == sizeof(dnnl_exec_arg_t));

ConvGeometry geometry(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k, std::int64_t kernel,
                      std::int64_t stride, std::int64_t pad, std::int64_t dilation) {
  const std::int64_t span = dilation * (kernel - 1) + 1;
  return {n, h, w, c, k, kernel, kernel, stride, pad, dilation, (h + 2 * pad - span) / stride + 1,
          (w + 2 * pad - span) / stride + 1};
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

template <class T>
void check_passes(const ConvGeometry& g, bool bias, std::uint32_t seed) {
  const std::vector<std::int64_t> shape{g.n, g.h, g.w, g.c, g.k, g.kh, g.stride, g.pad, g.dilation};
  CAPTURE(shape);
  CAPTURE(bias);
  Context<host> ctx;
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

  std::vector<T> y(dy.size());
  std::vector<T> dx(x.size());
  std::vector<float> dx32(x.size()), dw(wt.size()), db(b.size());
  conv_forward(ctx, g, x.data(), wt.data(), bias ? b.data() : nullptr, y.data());
  conv_backward_data(ctx, g, dy.data(), wt.data(), dx.data(), bias);
  conv_backward_data(ctx, g, dy.data(), wt.data(), dx32.data(), bias);
  conv_backward_weights(ctx, g, x.data(), dy.data(), dw.data(), bias ? db.data() : nullptr);

  // |terms| <= 1: the fp32 sums' error grows with the terms summed; T's rounding once.
  const auto rtol = [](std::int64_t terms, double out_roundoff) {
    return 4.0 * static_cast<double>(terms) * unit_roundoff<float> + 2.0 * out_roundoff;
  };
  const double window = static_cast<double>(g.window()) + 1, per_input = static_cast<double>(g.k * g.kh * g.kw);
  const auto pixels = g.pixels();
  CHECK(worst_error_ratio(to_double(y), y_ref, 0.0, rtol(g.window() + 1, unit_roundoff<T>) * window) <= 1.0);
  CHECK(worst_error_ratio(to_double(dx), dx_ref, 0.0, rtol(g.k * g.kh * g.kw, unit_roundoff<T>) * per_input) <= 1.0);
  CHECK(worst_error_ratio(to_double(dx32), dx_ref, 0.0, rtol(g.k * g.kh * g.kw, 0.0) * per_input) <= 1.0);
  CHECK(worst_error_ratio(to_double(dw), dw_ref, 0.0, rtol(pixels, 0.0) * static_cast<double>(pixels)) <= 1.0);
  if (bias) CHECK(worst_error_ratio(to_double(db), db_ref, 0.0, rtol(pixels, 0.0) * static_cast<double>(pixels)) <= 1.0);
  if (g.c == 16 && bias) {  // which kernels oneDNN chose on this CPU, for the log
    auto& plan = amp::detail::conv_plan<T, T>(ctx.library_state<amp::detail::OnednnState>(), g, bias);
    MESSAGE("oneDNN ", sizeof(T) == 2 ? "bf16" : "fp32", " convolution kernels here: forward ",
            std::string(plan.forward.op.impl_name()), ", input gradient ",
            std::string(plan.backward_data.op.impl_name()), ", filter gradient ",
            std::string(plan.backward_weights.op.impl_name()));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("oneDNN convolution passes against an FP64 direct convolution", T, float, bfloat16) {
  std::uint32_t seed = 11;
  for (const ConvGeometry& g : {geometry(2, 7, 7, 1, 8, 3, 1, 1, 1),     // a first layer on grey images
                                geometry(3, 9, 8, 16, 32, 3, 1, 1, 1),    // the CNN's middle layer, smaller
                                geometry(2, 11, 11, 5, 7, 3, 2, 1, 1),    // stride 2, odd channel counts
                                geometry(2, 10, 10, 4, 6, 3, 2, 1, 1),    // stride 2, even size
                                geometry(1, 12, 12, 8, 8, 3, 1, 2, 2),    // dilation 2
                                geometry(4, 5, 5, 24, 16, 1, 1, 0, 1),    // 1x1
                                geometry(2, 6, 6, 3, 5, 5, 1, 0, 1)}) {  // 5x5, no padding
    for (const bool bias : {true, false}) check_passes<T>(g, bias, seed += 4);
  }
}

TEST_CASE("oneDNN convolution: shapes it cannot run are refused, not run wrong") {
  Context<host> ctx;
  // Stride 3 over 8 pixels with no padding: the last row is never read (oneDNN
  // would need negative end padding); the layer takes its im2col path there.
  CHECK_FALSE(conv_available<float>(ctx, geometry(1, 8, 8, 2, 2, 3, 3, 0, 1), true));
  // fp16 has no oneDNN convolution on CPUs in oneDNN 2.x.
  CHECK_FALSE(conv_available<half>(ctx, geometry(1, 8, 8, 2, 2, 3, 1, 1, 1), true));
  std::vector<float> x(4), w(4), y(4);
  CHECK_THROWS_WITH_AS(conv_forward(ctx, geometry(1, 8, 8, 2, 2, 3, 3, 0, 1), x.data(), w.data(),
                                    static_cast<const float*>(nullptr), y.data()),
                       doctest::Contains("oneDNN has no convolution for this shape"), Error);
}
