#pragma once
// Upsample: nearest-neighbour enlargement of channels-last images [N, H, W, C]
// by an integer factor, as torch.nn.Upsample(scale_factor = s, mode =
// "nearest"): output pixel (h, w) copies input pixel (h / s, w / s). Its
// backward sums each input pixel's s x s block of the output gradient in fp32,
// one work item per input pixel, so nothing races and each sum rounds once.
#include <cstdint>

#include "amp/model/model.hpp"
#include "amp/nn/ops.hpp"

namespace amp::nn {

namespace detail {
template <class T>
struct UpsampleNearestOp {  // one output pixel
  const T* x;
  T* y;
  std::int64_t h, w, c, scale;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto q = static_cast<std::int64_t>(i);
    const std::int64_t wo = w * scale, ho = h * scale;
    const std::int64_t ow = q % wo, oh = (q / wo) % ho, n = q / (wo * ho);
    const T* in = x + ((n * h + oh / scale) * w + ow / scale) * c;
    T* out = y + q * c;
    for (std::int64_t ch = 0; ch < c; ++ch) out[ch] = in[ch];
  }
};

template <class T>
struct UpsampleNearestGradOp {  // one input pixel: dx (+)= the sum of its block of dy
  const T* dy;
  T* dx;
  std::int64_t h, w, c, scale;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto q = static_cast<std::int64_t>(i);
    const std::int64_t iw = q % w, ih = (q / w) % h, n = q / (w * h), wo = w * scale;
    const T* block = dy + ((n * h * scale + ih * scale) * wo + iw * scale) * c;
    for (std::int64_t ch = 0; ch < c; ++ch) {
      float acc = 0.0f;
      for (std::int64_t r = 0; r < scale; ++r)
        for (std::int64_t s = 0; s < scale; ++s) acc += cast<float>(block[(r * wo + s) * c + ch]);
      store_grad(dx, static_cast<std::size_t>(q * c + ch), acc, accumulate);
    }
  }
};
}  // namespace detail

template <class P, class B>
class Upsample {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  struct Config {
    std::int64_t scale = 2;  // integer factor, the same for height and width
  };
  static int torch_slots(const Config&) { return 1; }
  Upsample(Builder<P, B>, const Config& cfg) : scale_(cfg.scale) {
    AMP_REQUIRE(cfg.scale >= 1, "Upsample: scale must be a positive integer, got ", cfg.scale);
  }

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, "Upsample");
    AMP_REQUIRE(x.shape.rank() == 4, "Upsample: input ", x.shape.str(), " is not a channels-last batch [N, H, W, C]");
    const std::int64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3], s = scale_;
    Var<T> y = g.template tensor<T>(Shape{n, h * s, w * s, c});
    for_each(g.context(), static_cast<std::size_t>(n * h * s * w * s), detail::UpsampleNearestOp<T>{x.data, y.data, h, w, c, s},
             static_cast<std::size_t>(c));
    g.on_backward([=](Graph<P, B>& gb) {
      const T* dy = gb.grad(y);
      if (!dy) return;  // no gradient reached y: claim no slot for x
      if (const GradOut<T> dx = gb.grad_out(x))
        for_each(gb.context(), static_cast<std::size_t>(n * h * w),
                 detail::UpsampleNearestGradOp<T>{dy, dx.data, h, w, c, s, dx.accumulate},
                 static_cast<std::size_t>(c * s * s));
    });
    return y;
  }

 private:
  std::int64_t scale_;
};

}  // namespace amp::nn
