#pragma once
// Conv2d on channels-last images [N, H, W, C], weights in PyTorch's layout
// [K, C, kh, kw]. Where the backend has a library convolution for the compute
// type (backend/conv.hpp: oneDNN on the CPU for fp32 and bf16, cuDNN on the
// GPU for fp32, fp16 and bf16), the three passes are the library's; the filter
// gradient comes back in fp32 and is added into the gradient with one rounding,
// as is an input gradient that accumulates. Otherwise (fp16 on the CPU, a shape
// no library engine runs), im2col gathers
// every output pixel's receptive field into a row in tap-major order (r, s, c),
// so each tap is a contiguous run of channels, and the whole batch is one GEMM
// in compute_type<conv> with fp32 accumulation, its bias and relu/gelu fused
// into the epilogue: Y[N*Ho*Wo, K] = cols * Wt^T + b, where Wt is the weight
// copied to [K, kh, kw, C] per step (a few thousand values). Backward: the
// weight gradient is one GEMM into fp32 tap-major scratch (bias gradient
// fused), added into the [K, C, kh, kw] gradient with one rounding; the input
// gradient a GEMM into columns and col2im, written as a gather so nothing
// races. The columns are temporaries, rebuilt in backward rather than kept.
// That path is also the reference the library's is tested against.
#include <string>
#include <type_traits>

#include "amp/backend/conv.hpp"
#include "amp/backend/gemm.hpp"
#include "amp/model/model.hpp"
#include "amp/model/numerics_sites.hpp"
#include "amp/nn/ops.hpp"

namespace amp::nn {

namespace detail {
// Row p of the columns (an output pixel): cols[p, (r, s, c)] =
// x[n, ho*stride - pad + r*dil, wo*stride - pad + s*dil, c], or 0 outside. One
// work item per output pixel keeps index arithmetic out of the channel loops.
template <class T, class U>
struct Im2ColOp {
  const T* x;
  U* cols;
  ConvGeometry g;
  AMP_HOST_DEVICE void operator()(std::size_t pixel) const {
    if (g.c == 1) copy_taps(pixel, std::integral_constant<std::int64_t, 1>{});  // a first layer on grey images
    else copy_taps(pixel, g.c);
  }

  template <class Channels>
  AMP_HOST_DEVICE void copy_taps(std::size_t pixel, Channels channels) const {
    const auto p = static_cast<std::int64_t>(pixel);
    const std::int64_t wo = p % g.wo, ho = (p / g.wo) % g.ho, n = p / (g.wo * g.ho);
    U* out = cols + p * g.window();
    const T* image = x + n * g.h * g.w * channels;
    for (std::int64_t r = 0; r < g.kh; ++r) {
      const std::int64_t h = ho * g.stride - g.pad + r * g.dilation;
      for (std::int64_t s = 0; s < g.kw; ++s, out += channels) {
        const std::int64_t w = wo * g.stride - g.pad + s * g.dilation;
        if (h < 0 || h >= g.h || w < 0 || w >= g.w) {
          for (std::int64_t c = 0; c < channels; ++c) out[c] = cast<U>(0.0f);
        } else {
          const T* in = image + (h * g.w + w) * channels;
          for (std::int64_t c = 0; c < channels; ++c) out[c] = cast<U>(in[c]);
        }
      }
    }
  }
};

// Input pixel (n, h, w): dx[n, h, w, c] (+)= the sum of dcols over the output
// pixels whose window covers it, in fp32 and in tap order; one work item per
// input pixel, its channels in blocks summed in registers.
template <class D, class T>
struct Col2ImOp {
  static constexpr std::int64_t block = 16;  // channels summed at once: one AVX-512 register of floats
  const D* dcols;
  T* dx;
  ConvGeometry g;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t pixel) const {
    const auto q = static_cast<std::int64_t>(pixel);
    std::int64_t c0 = 0;
    for (; c0 + block <= g.c; c0 += block) sum_block(q, c0, std::integral_constant<std::int64_t, block>{});
    if (c0 < g.c) sum_block(q, c0, g.c - c0);
  }

  // Channels [c0, c0 + width): a constant width lets the loops over them vectorise.
  template <class Width>
  AMP_HOST_DEVICE void sum_block(std::int64_t q, std::int64_t c0, Width width) const {
    const std::int64_t w = q % g.w, h = (q / g.w) % g.h, n = q / (g.w * g.h);
    float acc[block] = {};
    for (std::int64_t r = 0; r < g.kh; ++r) {
      std::int64_t oh, ow;
      if (!output_at(h + g.pad - r * g.dilation, g.stride, g.ho, oh)) continue;
      for (std::int64_t s = 0; s < g.kw; ++s) {
        if (!output_at(w + g.pad - s * g.dilation, g.stride, g.wo, ow)) continue;
        const D* d = dcols + ((n * g.ho + oh) * g.wo + ow) * g.window() + (r * g.kw + s) * g.c + c0;
        for (std::int64_t j = 0; j < width; ++j) acc[j] += cast<float>(d[j]);
      }
    }
    T* out = dx + q * g.c + c0;
    with_flag(accumulate, [&](auto add) {
      for (std::int64_t j = 0; j < width; ++j) store_grad(out, static_cast<std::size_t>(j), acc[j], add);
    });
  }
};

using amp::detail::TapMajorIndex;
using amp::detail::ToTapMajorOp;
template <class GW>
struct AddTapMajorGradOp {  // grad[i] += dw[tap-major i], one rounding
  const float* dw;
  GW* grad;
  TapMajorIndex index;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { store_grad(grad, i, dw[index(i)], true); }
};

}  // namespace detail

// Q may be a layer policy (amp::KeepFp32<P>): the layer takes and returns its
// model's activations, converted at its boundary (see nn::Linear).
template <class Q, class B>
class Conv2d {
  static_assert(Policy<Q> && Backend<B>);

 public:
  using P = model_policy_t<Q>;            // the model's: its graph, store and activations
  using X = typename P::activation_type;  // what comes in and goes out
  using T = typename Q::activation_type;  // what the layer computes between its boundary casts
  using G = typename Q::template compute_type<op::conv>;
  using GW = typename Q::grad_type;
  static constexpr role R = weight_role_v<Q>;
  static_assert(R == role::weight || (std::is_same_v<typename Q::param_type, float> && std::is_same_v<GW, float>),
                "Conv2d: a layer policy stores its weights as its model's policy does, or in fp32 (amp::KeepFp32)");
  static_assert(std::is_same_v<T, G> || std::is_same_v<T, float>,
                "Conv2d: activation_type must be the conv compute type or fp32");
  static_assert(std::is_same_v<GW, G> || std::is_same_v<GW, float>,
                "Conv2d: grad_type must be the conv compute type or fp32");
  // The input-gradient columns: in G, or fp32 where activations are fp32.
  using DCol = std::conditional_t<std::is_same_v<T, G>, G, float>;
  // The backend's library may run it: activations in the compute type.
  static constexpr bool library_candidate = library_conv<B>::value && std::is_same_v<T, G>;

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
    s_.weight = b.template param<R>("weight", {cfg.out_channels, cfg.in_channels, cfg.kernel, cfg.kernel},
                                    weight_init(cfg.init, fan_in, cfg.out_channels * cfg.kernel * cfg.kernel));
    if (cfg.bias) s_.bias = b.template param<R>("bias", {cfg.out_channels}, Init::torch_default(fan_in), false);
  }

  Var<X> operator()(Graph<P, B>& g, Var<X> x) const {
    g.require_current(x, "Conv2d '", name_, "'");
    g.params().visit_layer(s_.weight.index);
    AMP_REQUIRE(x.shape.rank() == 4 && x.shape[3] == s_.c, "Conv2d '", name_, "' (", s_.c, " -> ", s_.k,
                " channels): input ", x.shape.str(), " is not a channels-last batch [N, H, W, ", s_.c, "]");
    const ConvGeometry geo = geometry(x.shape);
    AMP_REQUIRE(geo.ho > 0 && geo.wo > 0, "Conv2d '", name_, "': a ", s_.kernel, "x", s_.kernel, " kernel does not fit ",
                "the input ", x.shape.str(), " with padding ", s_.pad);
    Var<X> y = to_type<X>(g, forward(g, s_, geo, to_type<T>(g, x)));
    observe_layer(g, y, name_, "conv");
    return y;
  }

  Param<R> weight() const { return s_.weight; }
  Param<R> bias() const { return s_.bias; }

 private:
  struct Spec {
    std::int64_t c = 0, k = 0, kernel = 0, stride = 1, pad = 0, dilation = 1;
    activation act = activation::none;
    bool has_bias = false;
    Param<R> weight, bias;
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
    for_each(g.context(), static_cast<std::size_t>(geo.pixels()), detail::Im2ColOp<T, G>{x, cols, geo},
             static_cast<std::size_t>(geo.window()));
    return cols;
  }

  // The weight as [K, (r, s, c)], the columns' order: a copy in graph memory that backward reads too.
  static Matrix<const G> weight_matrix(Graph<P, B>& g, const Spec& s, const ConvGeometry& geo) {
    const auto count = static_cast<std::size_t>(geo.k * geo.window());
    G* out = g.template scratch<G>(count);
    for_each(g.context(), count,
             detail::ToTapMajorOp<G>{g.params().template as<G>(s.weight).data, out, {geo.c, geo.kh * geo.kw}});
    return {out, geo.k, geo.window(), geo.window()};
  }

  static Var<T> forward(Graph<P, B>& g, const Spec& s, const ConvGeometry& geo, Var<T> x) {
    Var<T> y = g.template tensor<T>(Shape{geo.n, geo.ho, geo.wo, geo.k});
    T* pre = s.act == activation::gelu ? g.template scratch<T>(y.size()) : nullptr;
    // Reordered once per forward and kept on the tape: the backward pass reads the same copy.
    const Matrix<const G> weight = weight_matrix(g, s, geo);
    if constexpr (library_candidate) {
      if (conv_available<G>(g.context(), geo, s.has_bias)) {
        auto& params = g.params();
        const G* bias = s.has_bias ? params.template as<G>(s.bias).data : nullptr;
        conv_forward(g.context(), geo, x.data, weight.data, bias, pre ? pre : y.data);
        using C = typename Q::template compute_type<op::pointwise>;
        if (s.act == activation::relu) for_each(g.context(), y.size(), detail::ActivationOp<ReluFn, C, T>{y.data, y.data});
        if (s.act == activation::gelu) for_each(g.context(), y.size(), detail::ActivationOp<GeluFn, C, T>{pre, y.data});
        g.on_backward([=](Graph<P, B>& gb) { library_backward(gb, s, geo, x, y, pre, weight.data); });
        return y;
      }
    }
    {
      Temporaries<P, B> temp(g);
      const Matrix<const G> cols(columns(g, geo, x.data), geo.pixels(), geo.window(), geo.window());
      GemmEpilogue<T> ep{.act = s.act, .pre_activation = pre};
      if (s.has_bias) ep.bias = g.params().template as<T>(s.bias).data;
      gemm(g.context(), cols, transpose::no, weight, transpose::yes, matrix(y.data, geo.pixels(), geo.k), ep);
    }
    g.on_backward([=](Graph<P, B>& gb) { backward(gb, s, geo, x, y, pre, weight); });
    return y;
  }

  // The library's backward: fp32 filter and bias gradients added with one
  // rounding; the input gradient written in place, or in fp32 and added.
  static void library_backward(Graph<P, B>& g, const Spec& s, const ConvGeometry& geo, Var<T> x, Var<T> y,
                               const T* pre, const G* w) {
    const T* dy = g.grad(y);
    if (!dy) return;
    auto& ctx = g.context();
    auto& params = g.params();
    const GradOut<T> dx = g.grad_out(x);
    Temporaries<P, B> temp(g);
    const T* dz = through_activation<Q>(g, s.act, y, pre, dy);
    const auto count = static_cast<std::size_t>(geo.k * geo.window());
    float* dw = g.template scratch<float>(count);
    float* db = s.has_bias ? g.template scratch<float>(static_cast<std::size_t>(geo.k)) : nullptr;
    conv_backward_weights(ctx, geo, x.data, dz, dw, db);
    for_each(ctx, count, detail::AddGradFromFloatOp<GW>{dw, params.backward_grads(s.weight).data});
    if (db) for_each(ctx, static_cast<std::size_t>(geo.k), detail::AddGradFromFloatOp<GW>{db, params.backward_grads(s.bias).data});
    if (!dx) return;
    if (!dx.accumulate) return conv_backward_data(ctx, geo, dz, w, dx.data, s.has_bias);
    float* part = g.template scratch<float>(x.size());  // summed with what dx holds, one rounding
    conv_backward_data(ctx, geo, dz, w, part, s.has_bias);
    for_each(ctx, x.size(), detail::AddGradFromFloatOp<T>{part, dx.data});
  }

  static void backward(Graph<P, B>& g, const Spec& s, const ConvGeometry& geo, Var<T> x, Var<T> y, const T* pre,
                       Matrix<const G> weight) {
    const T* dy = g.grad(y);
    if (!dy) return;
    auto& ctx = g.context();
    const GradOut<T> dx = g.grad_out(x);
    Temporaries<P, B> temp(g);
    const T* dz = through_activation<Q>(g, s.act, y, pre, dy);
    const Matrix<const G> dzg(as_type<G>(g, dz, y.size()), geo.pixels(), geo.k, geo.k);
    auto& params = g.params();
    {
      Temporaries<P, B> cols_scope(g);
      const Matrix<const G> cols(columns(g, geo, x.data), geo.pixels(), geo.window(), geo.window());
      const auto count = static_cast<std::size_t>(geo.k * geo.window());
      float* dw = g.template scratch<float>(count);
      GemmEpilogue<float> ep;
      if (s.has_bias) {
        ep.grad_bias = g.template scratch<float>(static_cast<std::size_t>(geo.k));
        fill(ctx, Span<float>{ep.grad_bias, static_cast<std::size_t>(geo.k)}, 0.0f);
      }
      gemm(ctx, dzg, transpose::yes, cols, transpose::no, matrix(dw, geo.k, geo.window()), ep);
      for_each(ctx, count, detail::AddTapMajorGradOp<GW>{dw, params.backward_grads(s.weight).data, {geo.c, geo.kh * geo.kw}});
      if (s.has_bias)
        for_each(ctx, static_cast<std::size_t>(geo.k), detail::AddGradFromFloatOp<GW>{ep.grad_bias, params.backward_grads(s.bias).data});
    }
    if (!dx) return;
    DCol* dcols = g.template scratch<DCol>(static_cast<std::size_t>(geo.pixels() * geo.window()));
    gemm(ctx, dzg, transpose::no, weight, transpose::no, matrix(dcols, geo.pixels(), geo.window()));
    for_each(ctx, static_cast<std::size_t>(geo.n * geo.h * geo.w), detail::Col2ImOp<DCol, T>{dcols, dx.data, geo, dx.accumulate},
             static_cast<std::size_t>(geo.window()));
  }

  std::string name_;
  Spec s_;
};

}  // namespace amp::nn
