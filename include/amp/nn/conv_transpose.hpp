#pragma once
// ConvTranspose2d on channels-last images [N, H, W, C], as PyTorch's: weights
// [in_channels, out_channels, kh, kw], output size
//   (H - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1.
// A transposed convolution is the input-gradient pass of the convolution that
// maps its output back to its input, and PyTorch's weight layout is that
// convolution's [K, C, kh, kw]. So this layer writes no convolution of its
// own: over the mirrored geometry (ConvGeometry with the roles of input and
// output swapped) its forward is the backend's conv_backward_data, its input
// gradient conv_forward and its filter gradient conv_backward_weights (oneDNN
// on the CPU, cuDNN on the GPU). Where the library does not run the shape or
// the type (fp16 on the CPU, output_padding > padding), the im2col + GEMM
// pieces of nn/conv.hpp do the same three passes. The forward sums in fp32 and
// rounds once with the bias added; the filter and bias gradients are fp32 sums
// added into the gradient with one rounding.
#include <string>
#include <type_traits>

#include "amp/backend/conv.hpp"
#include "amp/backend/gemm.hpp"
#include "amp/model/model.hpp"
#include "amp/nn/conv.hpp"
#include "amp/nn/ops.hpp"

namespace amp::nn {

namespace detail {
// y[p, c] = acc[p, c] + bias[c] (bias may be null), one rounding into T; y may be acc.
template <class T>
struct AddBiasRoundOp {
  const float* acc;
  const T* bias;
  T* y;
  std::int64_t channels;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const float b = bias ? cast<float>(bias[static_cast<std::int64_t>(i) % channels]) : 0.0f;
    y[i] = cast<T>(acc[i] + b);
  }
};
}  // namespace detail

template <class P, class B>
class ConvTranspose2d {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  using G = typename P::template compute_type<op::conv>;
  using GW = typename P::grad_type;
  static_assert(std::is_same_v<T, G> || std::is_same_v<T, float>,
                "ConvTranspose2d: activation_type must be the conv compute type or fp32");
  static_assert(std::is_same_v<GW, G> || std::is_same_v<GW, float>,
                "ConvTranspose2d: grad_type must be the conv compute type or fp32");
  static constexpr bool library_candidate = library_conv<B>::value && std::is_same_v<T, G>;

  struct Config {
    std::int64_t in_channels = 0;
    std::int64_t out_channels = 0;
    std::int64_t kernel = 3;
    std::int64_t stride = 1;
    std::int64_t padding = 0;
    std::int64_t output_padding = 0;  // extra rows and columns at the end, < stride
    std::int64_t dilation = 1;
    bool bias = true;
    initializer init = initializer::torch_default;  // PyTorch's
  };
  static int torch_slots(const Config&) { return 1; }

  ConvTranspose2d(Builder<P, B> b, const Config& cfg) : name_(b.prefix()) {
    AMP_REQUIRE(cfg.in_channels > 0 && cfg.out_channels > 0 && cfg.kernel > 0 && cfg.stride > 0 && cfg.padding >= 0 &&
                    cfg.dilation > 0,
                "ConvTranspose2d '", name_, "': channels, kernel, stride and dilation must be positive and padding >= 0");
    AMP_REQUIRE(cfg.output_padding >= 0 && cfg.output_padding < cfg.stride, "ConvTranspose2d '", name_,
                "': output_padding must lie in [0, stride = ", cfg.stride, "), got ", cfg.output_padding);
    s_ = {cfg.in_channels, cfg.out_channels, cfg.kernel, cfg.stride, cfg.padding, cfg.output_padding, cfg.dilation,
          cfg.bias, {}, {}};
    // PyTorch's fan-in of a transposed convolution's weight: out_channels x kernel area (its dimension 1).
    const std::int64_t fan_in = cfg.out_channels * cfg.kernel * cfg.kernel;
    s_.weight = b.template param<role::weight>("weight", {cfg.in_channels, cfg.out_channels, cfg.kernel, cfg.kernel},
                                               weight_init(cfg.init, fan_in, cfg.in_channels * cfg.kernel * cfg.kernel));
    if (cfg.bias) s_.bias = b.template param<role::weight>("bias", {cfg.out_channels}, Init::torch_default(fan_in), false);
  }

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, "ConvTranspose2d '", name_, "'");
    g.params().visit_layer(s_.weight.index);
    AMP_REQUIRE(x.shape.rank() == 4 && x.shape[3] == s_.in, "ConvTranspose2d '", name_, "' (", s_.in, " -> ", s_.out,
                " channels): input ", x.shape.str(), " is not a channels-last batch [N, H, W, ", s_.in, "]");
    const ConvGeometry geo = geometry(x.shape);
    AMP_REQUIRE(geo.h > 0 && geo.w > 0, "ConvTranspose2d '", name_, "': the input ", x.shape.str(), " with padding ",
                s_.pad, " gives no output pixel");
    return forward(g, s_, geo, x);
  }

  Param<role::weight> weight() const { return s_.weight; }
  Param<role::weight> bias() const { return s_.bias; }

 private:
  struct Spec {
    std::int64_t in = 0, out = 0, kernel = 0, stride = 1, pad = 0, output_pad = 0, dilation = 1;
    bool has_bias = false;
    Param<role::weight> weight, bias;
  };

  // The convolution this layer transposes: from its output [N, Ho, Wo, out] to its input [N, H, W, in].
  ConvGeometry geometry(const Shape& x) const {
    const auto out = [&](std::int64_t in) {
      return (in - 1) * s_.stride - 2 * s_.pad + s_.dilation * (s_.kernel - 1) + s_.output_pad + 1;
    };
    return {x[0], out(x[1]), out(x[2]), s_.out, s_.in, s_.kernel, s_.kernel, s_.stride, s_.pad, s_.dilation, x[1], x[2]};
  }

  static bool library(Graph<P, B>& g, const ConvGeometry& geo) {
    if constexpr (library_candidate)
      return conv_available<G, float>(g.context(), geo, false) && conv_available<G, G>(g.context(), geo, false);
    else return false;
  }

  static Var<T> forward(Graph<P, B>& g, const Spec& s, const ConvGeometry& geo, Var<T> x) {
    auto& ctx = g.context();
    auto& params = g.params();
    Var<T> y = g.template tensor<T>(Shape{geo.n, geo.h, geo.w, geo.c});
    const Matrix<const G> taps = tap_major(g, s, geo);  // kept on the tape: backward reads the same copy
    const bool lib = library(g, geo);
    {
      Temporaries<P, B> temp(g);
      float* acc = nullptr;  // the fp32 sums: y itself when it is fp32
      if constexpr (std::is_same_v<T, float>) acc = y.data;
      else acc = g.template scratch<float>(y.size());
      if constexpr (library_candidate) {
        if (lib) conv_backward_data(ctx, geo, x.data, taps.data, acc, false);
      }
      if (!lib) {
        const Matrix<const G> xg(as_type<G>(g, x.data, x.size()), geo.pixels(), geo.k, geo.k);
        float* dcols = g.template scratch<float>(static_cast<std::size_t>(geo.pixels() * geo.window()));
        gemm(ctx, xg, transpose::no, taps, transpose::no, matrix(dcols, geo.pixels(), geo.window()));
        for_each(ctx, static_cast<std::size_t>(geo.n * geo.h * geo.w), detail::Col2ImOp<float, float>{dcols, acc, geo, false},
                 static_cast<std::size_t>(geo.window()));
      }
      const T* bias = s.has_bias ? params.template as<T>(s.bias).data : nullptr;
      for_each(ctx, y.size(), detail::AddBiasRoundOp<T>{acc, bias, y.data, geo.c});
    }
    g.on_backward([=](Graph<P, B>& gb) { backward(gb, s, geo, x, y, lib, taps); });
    return y;
  }

  // The weight [in, (r, s, out)] in tap-major order, the columns' order, in graph scratch.
  static Matrix<const G> tap_major(Graph<P, B>& g, const Spec& s, const ConvGeometry& geo) {
    const auto count = static_cast<std::size_t>(geo.k * geo.window());
    G* out = g.template scratch<G>(count);
    for_each(g.context(), count,
             detail::ToTapMajorOp<G>{g.params().template as<G>(s.weight).data, out, {geo.c, geo.kh * geo.kw}});
    return {out, geo.k, geo.window(), geo.window()};
  }

  static void backward(Graph<P, B>& g, const Spec& s, const ConvGeometry& geo, Var<T> x, Var<T> y, bool lib,
                       Matrix<const G> taps) {
    const T* dy = g.grad(y);
    if (!dy) return;
    auto& ctx = g.context();
    auto& params = g.params();
    const GradOut<T> dx = g.grad_out(x);
    Temporaries<P, B> temp(g);
    if (s.has_bias) {  // the sum of dy over the pixels, per output channel
      float* db = g.template scratch<float>(static_cast<std::size_t>(geo.c));
      column_sums(g, geo.n * geo.h * geo.w, geo.c, detail::ValueAt<T>{dy, geo.c}, db);
      for_each(ctx, static_cast<std::size_t>(geo.c), detail::AddGradFromFloatOp<GW>{db, params.backward_grads(s.bias).data});
    }
    const auto count = static_cast<std::size_t>(geo.k * geo.window());
    float* dw = g.template scratch<float>(count);
    if constexpr (library_candidate) {
      if (lib) {
        conv_backward_weights<G, G>(ctx, geo, dy, x.data, dw, nullptr);  // [in, out, kh, kw], PyTorch's order
        for_each(ctx, count, detail::AddGradFromFloatOp<GW>{dw, params.backward_grads(s.weight).data});
        if (!dx) return;
        if (!dx.accumulate) return conv_forward<G>(ctx, geo, dy, taps.data, nullptr, dx.data);
        G* part = g.template scratch<G>(x.size());
        conv_forward<G>(ctx, geo, dy, taps.data, nullptr, part);
        for_each(ctx, x.size(), detail::AddGradOp<T>{part, dx.data, true});
        return;
      }
    }
    // im2col of dy over the mirrored geometry: each input pixel's receptive field in the output.
    G* cols = g.template scratch<G>(static_cast<std::size_t>(geo.pixels() * geo.window()));
    for_each(ctx, static_cast<std::size_t>(geo.pixels()), detail::Im2ColOp<T, G>{dy, cols, geo},
             static_cast<std::size_t>(geo.window()));
    const Matrix<const G> colm(cols, geo.pixels(), geo.window(), geo.window());
    const Matrix<const G> xg(as_type<G>(g, x.data, x.size()), geo.pixels(), geo.k, geo.k);
    gemm(ctx, xg, transpose::yes, colm, transpose::no, matrix(dw, geo.k, geo.window()));
    for_each(ctx, count, detail::AddTapMajorGradOp<GW>{dw, params.backward_grads(s.weight).data, {geo.c, geo.kh * geo.kw}});
    if (!dx) return;
    GemmEpilogue<T> ep{.beta = dx.accumulate ? 1.0f : 0.0f};
    gemm(ctx, colm, transpose::no, taps, transpose::yes, matrix(dx.data, geo.pixels(), geo.k), ep);
  }

  std::string name_;
  Spec s_;
};

}  // namespace amp::nn
