#pragma once
// Ops that combine or rearrange tensors: add (residuals), concat (along the
// last dimension, the channels of a channels-last image), flatten and its
// inverse unflatten, dropout.
#include <cstdint>

#include "amp/model/model.hpp"
#include "amp/nn/ops.hpp"

namespace amp::nn {

namespace detail {
template <class C, class T>
struct AddOp {
  const T* a;
  const T* b;
  T* y;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { y[i] = cast<T>(round_to<C>(cast<float>(a[i]) + cast<float>(b[i]))); }
};

// y[r, offset + c] = x[r, c]: a block of columns (concat) and its reverse (the split of the gradient).
template <class T>
struct ColumnBlockOp {
  const T* x;
  T* y;
  std::int64_t x_cols, y_cols, offset;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t r = static_cast<std::int64_t>(i) / x_cols, c = static_cast<std::int64_t>(i) % x_cols;
    y[r * y_cols + offset + c] = x[i];
  }
};
template <class T>
struct ColumnBlockGradOp {
  const T* dy;
  T* dx;
  std::int64_t x_cols, y_cols, offset;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t r = static_cast<std::int64_t>(i) / x_cols, c = static_cast<std::int64_t>(i) % x_cols;
    store_grad(dx, i, cast<float>(dy[r * y_cols + offset + c]), accumulate);
  }
};

// Channels-last [N, H, W, C] to PyTorch's flattened NCHW order [N, C*H*W], and
// back; one work item per pixel (n, p), channels in the inner loop.
template <class T>
struct FlattenOp {
  const T* x;
  T* y;
  std::int64_t hw, c;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t n = static_cast<std::int64_t>(i) / hw, p = static_cast<std::int64_t>(i) % hw;
    for (std::int64_t ch = 0; ch < c; ++ch) y[(n * c + ch) * hw + p] = x[static_cast<std::int64_t>(i) * c + ch];
  }
};
template <class T>
struct FlattenGradOp {
  const T* dy;
  T* dx;
  std::int64_t hw, c;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t n = static_cast<std::int64_t>(i) / hw, p = static_cast<std::int64_t>(i) % hw;
    for (std::int64_t ch = 0; ch < c; ++ch)
      store_grad(dx, i * static_cast<std::size_t>(c) + static_cast<std::size_t>(ch), cast<float>(dy[(n * c + ch) * hw + p]),
                 accumulate);
  }
};

// Unflatten's: PyTorch's flattened NCHW order [N, C*H*W] to channels-last
// [N, H, W, C] (a gather per pixel), and its gradient back (a scatter that
// adds); one work item per pixel (n, p).
template <class T>
struct UnflattenOp {
  const T* x;
  T* y;
  std::int64_t hw, c;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t n = static_cast<std::int64_t>(i) / hw, p = static_cast<std::int64_t>(i) % hw;
    for (std::int64_t ch = 0; ch < c; ++ch) y[static_cast<std::int64_t>(i) * c + ch] = x[(n * c + ch) * hw + p];
  }
};
template <class T>
struct UnflattenGradOp {
  const T* dy;
  T* dx;
  std::int64_t hw, c;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t n = static_cast<std::int64_t>(i) / hw, p = static_cast<std::int64_t>(i) % hw;
    for (std::int64_t ch = 0; ch < c; ++ch)
      store_grad(dx, static_cast<std::size_t>((n * c + ch) * hw + p), cast<float>(dy[static_cast<std::int64_t>(i) * c + ch]),
                 accumulate);
  }
};

// Inverted dropout with a counter-based mask: the same bits on every backend.
template <class C, class T>
struct DropoutOp {
  const T* x;
  T* y;
  RandomStream stream;
  float p, keep_scale;
  bool accumulate;  // backward: y is dx, x is dy
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const bool keep = unit_uniform(stream.key(), i) >= p;
    const float v = keep ? round_to<C>(cast<float>(x[i]) * keep_scale) : 0.0f;
    store_grad(y, i, v, accumulate);
  }
};
}  // namespace detail

// a + b (a residual connection); the gradient flows to both.
template <Policy P, Backend B>
Var<typename P::activation_type> add(Graph<P, B>& g, Var<typename P::activation_type> a,
                                     Var<typename P::activation_type> b) {
  using T = typename P::activation_type;
  using C = typename P::template compute_type<op::pointwise>;
  g.require_current(a, "add");
  g.require_current(b, "add");
  AMP_REQUIRE(a.shape == b.shape, "add: shapes ", a.shape.str(), " and ", b.shape.str(), " differ");
  Var<T> y = g.template tensor<T>(a.shape);
  for_each(g.context(), y.size(), detail::AddOp<C, T>{a.data, b.data, y.data});
  g.on_backward([=](Graph<P, B>& gb) {
    const T* dy = gb.grad(y);
    if (!dy) return;
    for (const Var<T>& in : {a, b})
      if (const GradOut<T> dx = gb.grad_out(in))
        for_each(gb.context(), y.size(), detail::AddGradOp<T>{dy, dx.data, dx.accumulate});
  });
  return y;
}

// [a, b] along the last dimension (channels); the gradient splits.
template <Policy P, Backend B>
Var<typename P::activation_type> concat(Graph<P, B>& g, Var<typename P::activation_type> a,
                                        Var<typename P::activation_type> b) {
  using T = typename P::activation_type;
  g.require_current(a, "concat");
  g.require_current(b, "concat");
  AMP_REQUIRE(a.shape.rank() == b.shape.rank() && a.rows() == b.rows() && a.shape.with(-1, 0) == b.shape.with(-1, 0),
              "concat: shapes ", a.shape.str(), " and ", b.shape.str(), " differ before the last dimension");
  const std::int64_t ca = a.cols(), cb = b.cols(), cy = ca + cb;
  Var<T> y = g.template tensor<T>(a.shape.with(-1, cy));
  for_each(g.context(), a.size(), detail::ColumnBlockOp<T>{a.data, y.data, ca, cy, 0});
  for_each(g.context(), b.size(), detail::ColumnBlockOp<T>{b.data, y.data, cb, cy, ca});
  g.on_backward([=](Graph<P, B>& gb) {
    const T* dy = gb.grad(y);
    if (!dy) return;
    if (const GradOut<T> da = gb.grad_out(a))
      for_each(gb.context(), a.size(), detail::ColumnBlockGradOp<T>{dy, da.data, ca, cy, 0, da.accumulate});
    if (const GradOut<T> db = gb.grad_out(b))
      for_each(gb.context(), b.size(), detail::ColumnBlockGradOp<T>{dy, db.data, cb, cy, ca, db.accumulate});
  });
  return y;
}

// [N, ...] -> [N, rest]; a channels-last image [N, H, W, C] flattens in
// PyTorch's NCHW order (c, h, w), so the Linear after it has PyTorch's weights.
template <class P, class B>
class Flatten {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  struct Config {};
  static int torch_slots(const Config&) { return 1; }
  Flatten(Builder<P, B>, const Config&) {}

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, "Flatten");
    AMP_REQUIRE(x.shape.rank() >= 2, "Flatten: input ", x.shape.str(), " has no dimension to flatten");
    const std::int64_t n = x.shape[0], per = x.shape.numel() / std::max<std::int64_t>(n, 1);
    Var<T> y = g.template tensor<T>(Shape{n, per});
    const std::int64_t c = x.shape.rank() == 4 ? x.shape[3] : per, hw = per / c;
    const auto pixels = static_cast<std::size_t>(n * hw);
    for_each(g.context(), pixels, detail::FlattenOp<T>{x.data, y.data, hw, c}, static_cast<std::size_t>(c));
    g.on_backward([=](Graph<P, B>& gb) {
      const T* dy = gb.grad(y);
      if (!dy) return;  // no gradient reached y: claim no slot for x
      const GradOut<T> dx = gb.grad_out(x);
      if (dy && dx)
        for_each(gb.context(), pixels, detail::FlattenGradOp<T>{dy, dx.data, hw, c, dx.accumulate}, static_cast<std::size_t>(c));
    });
    return y;
  }
};

// [N, C*H*W] -> [N, H, W, C]: the inverse of Flatten, as torch.nn.Unflatten(1,
// (C, H, W)): the features are read in PyTorch's NCHW order, so a Linear
// before it has PyTorch's weights, and the image comes out channels-last.
template <class P, class B>
class Unflatten {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  struct Config {
    std::int64_t channels = 0, height = 0, width = 0;
  };
  static int torch_slots(const Config&) { return 1; }
  Unflatten(Builder<P, B>, const Config& cfg) : cfg_(cfg) {
    AMP_REQUIRE(cfg.channels > 0 && cfg.height > 0 && cfg.width > 0, "Unflatten: channels, height and width must be "
                "positive, got ", cfg.channels, ", ", cfg.height, ", ", cfg.width);
  }

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, "Unflatten");
    const std::int64_t c = cfg_.channels, hw = cfg_.height * cfg_.width;
    AMP_REQUIRE(x.shape.rank() == 2 && x.shape[1] == c * hw, "Unflatten: input ", x.shape.str(), " is not [N, ", c * hw,
                "] (channels x height x width = ", c, " x ", cfg_.height, " x ", cfg_.width, ")");
    const std::int64_t n = x.shape[0];
    Var<T> y = g.template tensor<T>(Shape{n, cfg_.height, cfg_.width, c});
    const auto pixels = static_cast<std::size_t>(n * hw);
    for_each(g.context(), pixels, detail::UnflattenOp<T>{x.data, y.data, hw, c}, static_cast<std::size_t>(c));
    g.on_backward([=](Graph<P, B>& gb) {
      const T* dy = gb.grad(y);
      if (!dy) return;  // no gradient reached y: claim no slot for x
      if (const GradOut<T> dx = gb.grad_out(x))
        for_each(gb.context(), pixels, detail::UnflattenGradOp<T>{dy, dx.data, hw, c, dx.accumulate},
                 static_cast<std::size_t>(c));
    });
    return y;
  }

 private:
  Config cfg_;
};

template <Policy P, Backend B>
Var<typename P::activation_type> dropout(Graph<P, B>& g, Var<typename P::activation_type> x, float p) {
  using T = typename P::activation_type;
  using C = typename P::template compute_type<op::pointwise>;
  g.require_current(x, "dropout");
  if (!g.training() || p == 0.0f) return x;
  Var<T> y = g.template tensor<T>(x.shape);
  const detail::RandomStream stream = g.random_stream();
  const float keep_scale = 1.0f / (1.0f - p);
  for_each(g.context(), x.size(), detail::DropoutOp<C, T>{x.data, y.data, stream, p, keep_scale, false});
  g.on_backward([=](Graph<P, B>& gb) {
    const T* dy = gb.grad(y);
    if (!dy) return;  // no gradient reached y: claim no slot for x
    const GradOut<T> dx = gb.grad_out(x);
    if (dy && dx) for_each(gb.context(), x.size(), detail::DropoutOp<C, T>{dy, dx.data, stream, p, keep_scale, dx.accumulate});
  });
  return y;
}

// Inverted dropout: in training, each element is zeroed with probability p
// and the rest scaled by 1/(1-p); in evaluation it is the identity.
template <class P, class B>
class Dropout {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  struct Config {
    float p = 0.5f;
  };
  static int torch_slots(const Config&) { return 1; }
  Dropout(Builder<P, B>, const Config& cfg) : p_(cfg.p) {
    AMP_REQUIRE(cfg.p >= 0.0f && cfg.p < 1.0f, "Dropout: p must lie in [0, 1), got ", cfg.p);
  }

  Var<T> operator()(Graph<P, B>& g, Var<T> x) const { return dropout(g, x, p_); }

 private:
  float p_;
};

}  // namespace amp::nn
