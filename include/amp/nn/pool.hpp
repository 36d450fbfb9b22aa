#pragma once
// Pooling over channels-last images [N, H, W, C]. Max pooling keeps the
// position of each window's maximum (the first, as PyTorch) in one byte per
// output, and its backward gathers: each input element collects the gradients
// of the windows whose maximum it was, so nothing races. Average pooling
// counts padding as zeros (PyTorch's count_include_pad); its sums are rounded
// through compute_type<reduction>. Global average pooling gives [N, C].
#include <cstdint>
#include <string>

#include "amp/model/model.hpp"
#include "amp/nn/ops.hpp"

namespace amp::nn {

struct PoolGeometry {
  std::int64_t n, h, w, c, kernel, stride, pad, ho, wo;
};

namespace detail {
// One work item per pixel, channels in the inner loop: no index arithmetic there.
struct PixelOf {
  std::int64_t n, h, w;
  AMP_HOST_DEVICE PixelOf(std::size_t i, std::int64_t height, std::int64_t width) {
    const auto q = static_cast<std::int64_t>(i);
    w = q % width, h = (q / width) % height, n = q / (width * height);
  }
};

template <class T>
struct MaxPoolOp {
  const T* x;
  T* y;
  std::uint8_t* argmax;  // r * kernel + s of the maximum
  PoolGeometry g;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const PixelOf o(i, g.ho, g.wo);
    const std::int64_t channels = g.c;
    T* out = y + i * static_cast<std::size_t>(channels);
    std::uint8_t* at = argmax + i * static_cast<std::size_t>(channels);
    bool first = true;
    for (std::int64_t r = 0; r < g.kernel; ++r)
      for (std::int64_t s = 0; s < g.kernel; ++s) {
        const std::int64_t h = o.h * g.stride - g.pad + r, w = o.w * g.stride - g.pad + s;
        if (h < 0 || h >= g.h || w < 0 || w >= g.w) continue;
        const T* in = x + ((o.n * g.h + h) * g.w + w) * channels;
        const auto k = static_cast<std::uint8_t>(r * g.kernel + s);
        if (first) {
          for (std::int64_t c = 0; c < channels; ++c) out[c] = in[c], at[c] = k;
        } else {
          for (std::int64_t c = 0; c < channels; ++c) {  // the first maximum wins; NaN propagates. Selects vectorise
            const float v = cast<float>(in[c]), best = cast<float>(out[c]);
            const bool take = v > best || (v != v && best == best);
            out[c] = cast<T>(take ? v : best);
            at[c] = take ? k : at[c];
          }
        }
        first = false;
      }
  }
};

// For input pixel (h, w): f(offset of the output pixel, tap r * kernel + s) for each window that contains it.
template <class F>
AMP_HOST_DEVICE void each_window(const PoolGeometry& g, std::int64_t n, std::int64_t h, std::int64_t w, F f) {
  for (std::int64_t r = 0; r < g.kernel; ++r) {
    std::int64_t oh, ow;
    if (!output_at(h + g.pad - r, g.stride, g.ho, oh)) continue;
    for (std::int64_t s = 0; s < g.kernel; ++s)
      if (output_at(w + g.pad - s, g.stride, g.wo, ow)) f(((n * g.ho + oh) * g.wo + ow) * g.c, r * g.kernel + s);
  }
}

template <class T>
struct MaxPoolGradOp {
  const T* dy;
  const std::uint8_t* argmax;
  T* dx;
  PoolGeometry g;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const PixelOf p(i, g.h, g.w);
    const std::int64_t channels = g.c;
    T* out = dx + i * static_cast<std::size_t>(channels);
    bool write = !accumulate;  // the first window writes (unless accumulating), the others add
    each_window(g, p.n, p.h, p.w, [&](std::int64_t o, std::int64_t k) {
      const T* d = dy + o;
      const std::uint8_t* at = argmax + o;
      if (write) {
        for (std::int64_t c = 0; c < channels; ++c) out[c] = cast<T>(at[c] == k ? cast<float>(d[c]) : 0.0f);
      } else {
        for (std::int64_t c = 0; c < channels; ++c) out[c] = cast<T>(cast<float>(out[c]) + (at[c] == k ? cast<float>(d[c]) : 0.0f));
      }
      write = false;
    });
    if (write)
      for (std::int64_t c = 0; c < channels; ++c) out[c] = cast<T>(0.0f);
  }
};

template <class C, class T>
struct AvgPoolOp {
  const T* x;
  T* y;
  PoolGeometry g;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const PixelOf o(i, g.ho, g.wo);
    for (std::int64_t c = 0; c < g.c; ++c) {
      float sum = 0.0f;
      for (std::int64_t r = 0; r < g.kernel; ++r)
        for (std::int64_t s = 0; s < g.kernel; ++s) {
          const std::int64_t h = o.h * g.stride - g.pad + r, w = o.w * g.stride - g.pad + s;
          if (h >= 0 && h < g.h && w >= 0 && w < g.w) sum += cast<float>(x[((o.n * g.h + h) * g.w + w) * g.c + c]);
        }
      y[i * static_cast<std::size_t>(g.c) + static_cast<std::size_t>(c)] =
          cast<T>(round_to<C>(sum / static_cast<float>(g.kernel * g.kernel)));
    }
  }
};

template <class C, class T>
struct AvgPoolGradOp {
  const T* dy;
  T* dx;
  PoolGeometry g;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const PixelOf p(i, g.h, g.w);
    for (std::int64_t c = 0; c < g.c; ++c) {
      float acc = 0.0f;
      each_window(g, p.n, p.h, p.w, [&](std::int64_t o, std::int64_t) { acc += cast<float>(dy[o + c]); });
      store_grad(dx, i * static_cast<std::size_t>(g.c) + static_cast<std::size_t>(c),
                 round_to<C>(acc / static_cast<float>(g.kernel * g.kernel)), accumulate);
    }
  }
};

// [N, H*W, C] -> [N, C]: the mean over positions; and its backward.
template <class C, class T>
struct GlobalMeanOp {
  const T* x;
  T* y;
  std::int64_t positions, c;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t n = static_cast<std::int64_t>(i) / c, ch = static_cast<std::int64_t>(i) % c;
    float sum = 0.0f;
    for (std::int64_t p = 0; p < positions; ++p) sum += cast<float>(x[(n * positions + p) * c + ch]);
    y[i] = cast<T>(round_to<C>(sum / static_cast<float>(positions)));
  }
};
template <class C, class T>
struct GlobalMeanGradOp {  // one work item per pixel
  const T* dy;
  T* dx;
  std::int64_t positions, c;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t n = static_cast<std::int64_t>(i) / positions;
    for (std::int64_t ch = 0; ch < c; ++ch)
      store_grad(dx, i * static_cast<std::size_t>(c) + static_cast<std::size_t>(ch),
                 round_to<C>(cast<float>(dy[n * c + ch]) / static_cast<float>(positions)), accumulate);
  }
};
}  // namespace detail

template <class P, class B, bool Max>
class Pool2d {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  using C = typename P::template compute_type<op::reduction>;
  struct Config {
    std::int64_t kernel = 2;
    std::int64_t stride = 0;  // 0: the kernel size, as PyTorch
    std::int64_t padding = 0;
  };
  static int torch_slots(const Config&) { return 1; }

  Pool2d(Builder<P, B> b, const Config& cfg) : name_(b.prefix()), cfg_(cfg) {
    if (cfg_.stride == 0) cfg_.stride = cfg_.kernel;
    AMP_REQUIRE(cfg_.kernel > 0 && cfg_.kernel <= 15 && cfg_.stride > 0 && cfg_.padding >= 0 &&
                    2 * cfg_.padding <= cfg_.kernel,
                "Pool2d '", name_, "': need 0 < kernel <= 15, stride > 0 and 0 <= padding <= kernel / 2");
  }

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, "Pool2d '", name_, "'");
    AMP_REQUIRE(x.shape.rank() == 4, "Pool2d '", name_, "': input ", x.shape.str(),
                " is not a channels-last batch [N, H, W, C]");
    const auto out = [&](std::int64_t in) {  // 0 when the window does not fit (no rounding toward zero)
      const std::int64_t room = in + 2 * cfg_.padding - cfg_.kernel;
      return room < 0 ? 0 : room / cfg_.stride + 1;
    };
    const PoolGeometry geo{x.shape[0], x.shape[1], x.shape[2], x.shape[3], cfg_.kernel, cfg_.stride, cfg_.padding,
                           out(x.shape[1]), out(x.shape[2])};
    AMP_REQUIRE(geo.ho > 0 && geo.wo > 0, "Pool2d '", name_, "': a ", cfg_.kernel, "x", cfg_.kernel,
                " window does not fit the input ", x.shape.str());
    Var<T> y = g.template tensor<T>(Shape{geo.n, geo.ho, geo.wo, geo.c});
    auto& ctx = g.context();
    const auto window = static_cast<std::size_t>(geo.c * cfg_.kernel * cfg_.kernel);  // an item's work
    if constexpr (Max) {
      std::uint8_t* argmax = g.template scratch<std::uint8_t>(y.size());
      for_each(ctx, static_cast<std::size_t>(geo.n * geo.ho * geo.wo), detail::MaxPoolOp<T>{x.data, y.data, argmax, geo},
               window);
      g.on_backward([=](Graph<P, B>& gb) {
        const T* dy = gb.grad(y);
        if (!dy) return;  // no gradient reached y: claim no slot for x
        const GradOut<T> dx = gb.grad_out(x);
        if (dy && dx)
          for_each(gb.context(), static_cast<std::size_t>(geo.n * geo.h * geo.w),
                   detail::MaxPoolGradOp<T>{dy, argmax, dx.data, geo, dx.accumulate}, window);
      });
    } else {
      for_each(ctx, static_cast<std::size_t>(geo.n * geo.ho * geo.wo), detail::AvgPoolOp<C, T>{x.data, y.data, geo},
               window);
      g.on_backward([=](Graph<P, B>& gb) {
        const T* dy = gb.grad(y);
        if (!dy) return;  // no gradient reached y: claim no slot for x
        const GradOut<T> dx = gb.grad_out(x);
        if (dy && dx)
          for_each(gb.context(), static_cast<std::size_t>(geo.n * geo.h * geo.w),
                   detail::AvgPoolGradOp<C, T>{dy, dx.data, geo, dx.accumulate}, window);
      });
    }
    return y;
  }

 private:
  std::string name_;
  Config cfg_;
};

template <class P, class B>
using MaxPool2d = Pool2d<P, B, true>;
template <class P, class B>
using AvgPool2d = Pool2d<P, B, false>;

// [N, H, W, C] -> [N, C] (PyTorch: AdaptiveAvgPool2d(1) then flatten).
template <class P, class B>
class GlobalAvgPool {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  using C = typename P::template compute_type<op::reduction>;
  struct Config {};
  static int torch_slots(const Config&) { return 2; }
  GlobalAvgPool(Builder<P, B>, const Config&) {}

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, "GlobalAvgPool");
    AMP_REQUIRE(x.shape.rank() == 4, "GlobalAvgPool: input ", x.shape.str(), " is not a batch [N, H, W, C]");
    const std::int64_t n = x.shape[0], positions = x.shape[1] * x.shape[2], c = x.shape[3];
    Var<T> y = g.template tensor<T>(Shape{n, c});
    for_each(g.context(), y.size(), detail::GlobalMeanOp<C, T>{x.data, y.data, positions, c},
             static_cast<std::size_t>(positions));
    g.on_backward([=](Graph<P, B>& gb) {
      const T* dy = gb.grad(y);
      if (!dy) return;  // no gradient reached y: claim no slot for x
      const GradOut<T> dx = gb.grad_out(x);
      if (dy && dx)
        for_each(gb.context(), static_cast<std::size_t>(n * positions),
                 detail::GlobalMeanGradOp<C, T>{dy, dx.data, positions, c, dx.accumulate},
                 static_cast<std::size_t>(c));
    });
    return y;
  }
};

}  // namespace amp::nn
