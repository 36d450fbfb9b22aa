#pragma once
// Conv2d on channels-last images [N, H, W, C], weights in PyTorch's layout
// [K, C, kh, kw]. im2col gathers every output pixel's receptive field into a
// row (columns in the weight's (c, r, s) order), so the whole batch is one
// GEMM in compute_type<conv> with fp32 accumulation, its bias and relu/gelu
// fused into the epilogue: Y[N*Ho*Wo, K] = cols * W^T + b. Backward: the
// weight gradient is one GEMM (bias gradient fused), the input gradient a GEMM
// into columns and col2im, written as a gather so nothing races. The columns
// are temporaries, rebuilt in backward rather than kept.
#include <string>
#include <type_traits>

#include "amp/backend/gemm.hpp"
#include "amp/nn/module.hpp"
#include "amp/nn/ops.hpp"

namespace amp::nn {

struct ConvGeometry {
  std::int64_t n, h, w, c;     // input
  std::int64_t k, kh, kw;      // filters
  std::int64_t stride, pad, dilation;
  std::int64_t ho, wo;         // output

  AMP_HOST_DEVICE std::int64_t pixels() const { return n * ho * wo; }
  AMP_HOST_DEVICE std::int64_t window() const { return c * kh * kw; }
};

namespace detail {
// Row p of the columns (an output pixel): cols[p, (c, r, s)] =
// x[n, ho*stride - pad + r*dil, wo*stride - pad + s*dil, c], or 0 outside. One
// work item per output pixel keeps index arithmetic out of the inner loops.
template <class T, class U>
struct Im2ColOp {
  const T* x;
  U* cols;
  ConvGeometry g;
  AMP_HOST_DEVICE void operator()(std::size_t pixel) const {
    const auto p = static_cast<std::int64_t>(pixel);
    const std::int64_t wo = p % g.wo, ho = (p / g.wo) % g.ho, n = p / (g.wo * g.ho);
    U* row = cols + p * g.window();
    const T* image = x + n * g.h * g.w * g.c;
    const std::int64_t taps = g.kh * g.kw;
    for (std::int64_t r = 0; r < g.kh; ++r) {
      const std::int64_t h = ho * g.stride - g.pad + r * g.dilation;
      for (std::int64_t s = 0; s < g.kw; ++s) {
        const std::int64_t w = wo * g.stride - g.pad + s * g.dilation;
        U* out = row + r * g.kw + s;  // column (c, r, s) = c * taps + r * kw + s
        if (h < 0 || h >= g.h || w < 0 || w >= g.w) {
          for (std::int64_t c = 0; c < g.c; ++c) out[c * taps] = cast<U>(0.0f);
        } else {
          const T* in = image + (h * g.w + w) * g.c;
          for (std::int64_t c = 0; c < g.c; ++c) out[c * taps] = cast<U>(in[c]);
        }
      }
    }
  }
};

// Input pixel (n, h, w): dx[n, h, w, c] (+)= the sum of dcols over the output
// pixels whose window covers it, in fp32; one work item per input pixel.
template <class D, class T>
struct Col2ImOp {
  const D* dcols;
  T* dx;
  ConvGeometry g;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t pixel) const {
    const auto q = static_cast<std::int64_t>(pixel);
    const std::int64_t w = q % g.w, h = (q / g.w) % g.h, n = q / (g.w * g.h);
    // The (output pixel, tap) pairs that read this input pixel: at most 64 (kernels up to 8x8) kept here.
    constexpr int max_taps = 64;
    std::int64_t where[max_taps];
    int taps = 0;
    bool overflow = false;
    for (std::int64_t r = 0; r < g.kh; ++r) {
      const std::int64_t hh = h + g.pad - r * g.dilation;
      if (hh < 0 || hh % g.stride != 0 || hh / g.stride >= g.ho) continue;
      for (std::int64_t s = 0; s < g.kw; ++s) {
        const std::int64_t ww = w + g.pad - s * g.dilation;
        if (ww < 0 || ww % g.stride != 0 || ww / g.stride >= g.wo) continue;
        const std::int64_t p = (n * g.ho + hh / g.stride) * g.wo + ww / g.stride;
        if (taps == max_taps) overflow = true;
        else where[taps++] = p * g.window() + r * g.kw + s;  // + c * kh * kw per channel
      }
    }
    const std::int64_t stride_c = g.kh * g.kw;
    for (std::int64_t c = 0; c < g.c; ++c) {
      float acc = 0.0f;
      if (!overflow) {
        for (int t = 0; t < taps; ++t) acc += cast<float>(dcols[where[t] + c * stride_c]);
      } else {  // a kernel over 8x8: recompute the pairs per channel
        for (std::int64_t r = 0; r < g.kh; ++r) {
          const std::int64_t hh = h + g.pad - r * g.dilation;
          if (hh < 0 || hh % g.stride != 0 || hh / g.stride >= g.ho) continue;
          for (std::int64_t s = 0; s < g.kw; ++s) {
            const std::int64_t ww = w + g.pad - s * g.dilation;
            if (ww < 0 || ww % g.stride != 0 || ww / g.stride >= g.wo) continue;
            const std::int64_t p = (n * g.ho + hh / g.stride) * g.wo + ww / g.stride;
            acc += cast<float>(dcols[p * g.window() + c * stride_c + r * g.kw + s]);
          }
        }
      }
      store_grad(dx, static_cast<std::size_t>(q * g.c + c), acc, accumulate);
    }
  }
};

}  // namespace detail

template <class P, class B>
class Conv2d {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  using G = typename P::template compute_type<op::conv>;
  using GW = typename P::grad_type;
  static_assert(std::is_same_v<T, G> || std::is_same_v<T, float>,
                "Conv2d: activation_type must be the conv compute type or fp32");
  static_assert(std::is_same_v<GW, G> || std::is_same_v<GW, float>,
                "Conv2d: grad_type must be the conv compute type or fp32");
  // The input-gradient columns: in G, or fp32 where activations are fp32.
  using DCol = std::conditional_t<std::is_same_v<T, G>, G, float>;

  struct Config {
    std::int64_t in_channels = 0;
    std::int64_t out_channels = 0;
    std::int64_t kernel = 3;
    std::int64_t stride = 1;
    std::int64_t padding = 0;
    std::int64_t dilation = 1;
    bool bias = true;
    activation act = activation::none;
    initializer init = initializer::kaiming_uniform;
  };
  static int torch_slots(const Config& c) { return c.act == activation::none ? 1 : 2; }

  Conv2d(Builder<P, B> b, const Config& cfg) : name_(b.prefix()) {
    AMP_REQUIRE(cfg.in_channels > 0 && cfg.out_channels > 0 && cfg.kernel > 0 && cfg.stride > 0 && cfg.padding >= 0 &&
                    cfg.dilation > 0,
                "Conv2d '", name_, "': channels, kernel, stride and dilation must be positive and padding >= 0");
    s_.c = cfg.in_channels, s_.k = cfg.out_channels, s_.kernel = cfg.kernel, s_.stride = cfg.stride;
    s_.pad = cfg.padding, s_.dilation = cfg.dilation, s_.act = cfg.act, s_.has_bias = cfg.bias;
    const std::int64_t fan_in = cfg.in_channels * cfg.kernel * cfg.kernel;
    s_.weight = b.template param<role::weight>("weight", {cfg.out_channels, cfg.in_channels, cfg.kernel, cfg.kernel},
                                               weight_init(cfg.init, fan_in, cfg.out_channels * cfg.kernel * cfg.kernel));
    if (cfg.bias) s_.bias = b.template param<role::weight>("bias", {cfg.out_channels}, Init::torch_default(fan_in), false);
  }

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    AMP_REQUIRE(x.shape.rank() == 4 && x.shape[3] == s_.c, "Conv2d '", name_, "' (", s_.c, " -> ", s_.k,
                " channels): input ", x.shape.str(), " is not a channels-last batch [N, H, W, ", s_.c, "]");
    const ConvGeometry geo = geometry(x.shape);
    AMP_REQUIRE(geo.ho > 0 && geo.wo > 0, "Conv2d '", name_, "': a ", s_.kernel, "x", s_.kernel, " kernel does not fit ",
                "the input ", x.shape.str(), " with padding ", s_.pad);
    return forward(g, s_, geo, x);
  }

  Param<role::weight> weight() const { return s_.weight; }
  Param<role::weight> bias() const { return s_.bias; }

 private:
  struct Spec {
    std::int64_t c = 0, k = 0, kernel = 0, stride = 1, pad = 0, dilation = 1;
    activation act = activation::none;
    bool has_bias = false;
    Param<role::weight> weight, bias;
  };

  ConvGeometry geometry(const Shape& x) const {
    const std::int64_t span = s_.dilation * (s_.kernel - 1) + 1;
    const auto out = [&](std::int64_t in) {  // 0 when the kernel does not fit (no rounding toward zero)
      const std::int64_t room = in + 2 * s_.pad - span;
      return room < 0 ? 0 : room / s_.stride + 1;
    };
    return {x[0], x[1], x[2], x[3], s_.k, s_.kernel, s_.kernel, s_.stride, s_.pad, s_.dilation, out(x[1]), out(x[2])};
  }

  static G* columns(Graph<P, B>& g, const ConvGeometry& geo, const T* x) {
    G* cols = g.template scratch<G>(static_cast<std::size_t>(geo.pixels() * geo.window()));
    for_each(g.context(), static_cast<std::size_t>(geo.pixels()), detail::Im2ColOp<T, G>{x, cols, geo});
    return cols;
  }

  static Matrix<const G> weight_matrix(Graph<P, B>& g, const Spec& s, const ConvGeometry& geo) {
    return {g.params().template as<G>(s.weight).data, geo.k, geo.window(), geo.window()};
  }

  static Var<T> forward(Graph<P, B>& g, const Spec& s, const ConvGeometry& geo, Var<T> x) {
    Var<T> y = g.template tensor<T>(Shape{geo.n, geo.ho, geo.wo, geo.k});
    T* pre = s.act == activation::gelu ? g.template scratch<T>(y.size()) : nullptr;
    {
      Temporaries<P, B> temp(g);
      const Matrix<const G> cols(columns(g, geo, x.data), geo.pixels(), geo.window(), geo.window());
      GemmEpilogue<T> ep{.act = s.act, .pre_activation = pre};
      if (s.has_bias) ep.bias = g.params().template as<T>(s.bias).data;
      gemm(g.context(), cols, transpose::no, weight_matrix(g, s, geo), transpose::yes,
           matrix(y.data, geo.pixels(), geo.k), ep);
    }
    g.on_backward([=](Graph<P, B>& gb) { backward(gb, s, geo, x, y, pre); });
    return y;
  }

  static void backward(Graph<P, B>& g, const Spec& s, const ConvGeometry& geo, Var<T> x, Var<T> y, const T* pre) {
    const T* dy = g.grad(y);
    if (!dy) return;
    auto& ctx = g.context();
    const GradOut<T> dx = g.grad_out(x);
    Temporaries<P, B> temp(g);
    const T* dz = dy;
    if (s.act != activation::none) {
      T* buf = g.template scratch<T>(y.size());
      using C = typename P::template compute_type<op::pointwise>;
      if (s.act == activation::relu)
        for_each(ctx, y.size(), detail::ActivationGradOp<ReluFn, C, T>{nullptr, y.data, dy, buf, false});
      else
        for_each(ctx, y.size(), detail::ActivationGradOp<GeluFn, C, T>{pre, y.data, dy, buf, false});
      dz = buf;
    }
    const Matrix<const G> dzg(as_type<G>(g, dz, y.size()), geo.pixels(), geo.k, geo.k);
    auto& params = g.params();
    {
      Temporaries<P, B> cols_scope(g);
      const Matrix<const G> cols(columns(g, geo, x.data), geo.pixels(), geo.window(), geo.window());
      GemmEpilogue<GW> ep{.beta = 1.0f};
      if (s.has_bias) ep.grad_bias = params.grads(s.bias).data;
      gemm(ctx, dzg, transpose::yes, cols, transpose::no, matrix(params.grads(s.weight).data, geo.k, geo.window()), ep);
    }
    if (!dx) return;
    DCol* dcols = g.template scratch<DCol>(static_cast<std::size_t>(geo.pixels() * geo.window()));
    gemm(ctx, dzg, transpose::no, weight_matrix(g, s, geo), transpose::no, matrix(dcols, geo.pixels(), geo.window()));
    for_each(ctx, static_cast<std::size_t>(geo.n * geo.h * geo.w), detail::Col2ImOp<DCol, T>{dcols, dx.data, geo, dx.accumulate});
  }

  std::string name_;
  Spec s_;
};

}  // namespace amp::nn
