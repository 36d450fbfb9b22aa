// The layers of a convolutional decoder: ConvTranspose2d (PyTorch's semantics
// and weight layout [in, out, kh, kw]), Upsample (nearest) and Unflatten.
// The forward against a direct loop of the transposed convolution's definition
// (each input pixel scattered through the kernel), on the library path and the
// im2col path; and a decoder's every gradient against FP64 central differences.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "amp/amp.hpp"
#include "support/model_values.hpp"
#include "support/reference.hpp"
#include "support/reference_nn.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;
using nn::Var;

namespace {

struct TransposeCase {
  std::int64_t h, w, in, out, kernel, stride, pad, output_pad, dilation;
};

// PyTorch's definition: y[n, h*s - p + r*d, w*s - p + q*d, o] += x[n, h, w, i] W[i, o, r, q], plus the bias.
Vec conv_transpose2d(const Vec& x, Image s, const Vec& w, const Vec& b, const TransposeCase& c, Image* out) {
  const auto size = [&](std::int64_t in) {
    return (in - 1) * c.stride - 2 * c.pad + c.dilation * (c.kernel - 1) + c.output_pad + 1;
  };
  const Image o{s.n, size(s.h), size(s.w), c.out};
  Vec y(static_cast<std::size_t>(o.n * o.h * o.w * o.c), 0.0);
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t ww = 0; ww < s.w; ++ww)
        for (std::int64_t r = 0; r < c.kernel; ++r)
          for (std::int64_t q = 0; q < c.kernel; ++q) {
            const std::int64_t oh = h * c.stride - c.pad + r * c.dilation, ow = ww * c.stride - c.pad + q * c.dilation;
            if (oh < 0 || oh >= o.h || ow < 0 || ow >= o.w) continue;
            for (std::int64_t i = 0; i < c.in; ++i)
              for (std::int64_t k = 0; k < c.out; ++k)
                y[((n * o.h + oh) * o.w + ow) * o.c + k] +=
                    x[((n * s.h + h) * s.w + ww) * s.c + i] * w[((i * c.out + k) * c.kernel + r) * c.kernel + q];
          }
  if (!b.empty())
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += b[i % b.size()];
  *out = o;
  return y;
}

Vec upsample(const Vec& x, Image s, std::int64_t scale, Image* out) {
  *out = {s.n, s.h * scale, s.w * scale, s.c};
  Vec y(x.size() * static_cast<std::size_t>(scale * scale));
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t h = 0; h < out->h; ++h)
      for (std::int64_t w = 0; w < out->w; ++w)
        for (std::int64_t c = 0; c < s.c; ++c)
          y[((n * out->h + h) * out->w + w) * s.c + c] = x[((n * s.h + h / scale) * s.w + w / scale) * s.c + c];
  return y;
}

// [N, C*H*W] in PyTorch's (c, h, w) order -> channels-last [N, H, W, C].
Vec unflatten(const Vec& x, Image s) {
  Vec y(x.size());
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c)
      for (std::int64_t p = 0; p < s.h * s.w; ++p) y[(n * s.h * s.w + p) * s.c + c] = x[(n * s.c + c) * s.h * s.w + p];
  return y;
}

template <class P, class B>
struct OneTranspose {
  using T = typename P::activation_type;
  nn::ConvTranspose2d<P, B> t;
  TransposeCase c;
  OneTranspose(nn::Builder<P, B> b, TransposeCase tc)
      : t(b.child("t"), {.in_channels = tc.in, .out_channels = tc.out, .kernel = tc.kernel, .stride = tc.stride,
                         .padding = tc.pad, .output_padding = tc.output_pad, .dilation = tc.dilation}),
        c(tc) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{c.h, c.w, c.in}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) { return t(g, x); }
};

constexpr std::int64_t N = 3;

}  // namespace

TEST_CASE_TEMPLATE("ConvTranspose2d's forward against a direct loop of its definition", P, O0Policy, O2BF16Policy,
                   O2Policy) {
  const TransposeCase cases[] = {
      {4, 5, 3, 2, 3, 1, 0, 0, 1},   // stride 1: the library's path in fp32
      {4, 4, 3, 5, 3, 2, 1, 1, 1},   // stride 2, padding 1, output_padding 1: exactly twice the size
      {3, 4, 2, 3, 2, 2, 0, 1, 1},   // output_padding > padding: the im2col path for every type
      {3, 3, 4, 2, 3, 3, 1, 2, 2},   // stride 3, dilation 2
      {5, 5, 1, 17, 4, 2, 1, 0, 1},  // one input channel, 17 outputs (col2im's vector block and its rest)
  };
  for (const TransposeCase& c : cases) {
    CAPTURE(c.stride);
    CAPTURE(c.pad);
    CAPTURE(c.output_pad);
    Context<host> ctx;
    nn::Model<P, host, OneTranspose<P, host>> model(ctx, {.max_batch = N, .seed = 5}, c);
    const auto x = exact_inputs(static_cast<std::size_t>(N * c.h * c.w * c.in), 31);
    auto out = model.forward(ctx, TensorView<const float>(x.data(), Shape{N, c.h, c.w, c.in}));
    const Params p = consumed_values(model.parameters());
    Image shape;
    const Vec ref = conv_transpose2d(to_double(x), {N, c.h, c.w, c.in}, p.at("t.weight"), p.at("t.bias"), c, &shape);
    CHECK(out.shape() == Shape{N, shape.h, shape.w, c.out});
    CHECK(model.parameters().table().at(0).shape == Shape{c.in, c.out, c.kernel, c.kernel});  // PyTorch's layout
    const auto y = out.value();
    const Vec got = to_double(download(ctx, Span<const typename P::activation_type>(y.data, y.size())));
    // fp32 sums of at most in x kernel^2 terms (|terms| <= 1.5), rounded once into the activation type.
    const double terms = static_cast<double>(c.in * c.kernel * c.kernel + 1);
    CHECK(worst_error_ratio(got, ref, 2 * unit_roundoff<typename P::activation_type>,
                            8 * terms * unit_roundoff<float> * 1.5) <= 1.0);
  }
}

namespace {
// Linear -> Unflatten -> [ConvTranspose2d (library path in fp32) + Upsample] (fan-out: the input gradient
// accumulates) -> ConvTranspose2d with output_padding > padding (im2col path), then mse against a tensor target.
template <class P, class B>
struct Decoder {
  using T = typename P::activation_type;
  nn::Linear<P, B> fc;
  nn::Unflatten<P, B> unflat;
  nn::ConvTranspose2d<P, B> t1, t2;
  nn::Upsample<P, B> up;
  explicit Decoder(nn::Builder<P, B> b)
      : fc(b.child("fc"), {.in_features = 5, .out_features = 18}),
        unflat(b.child("unflat"), {.channels = 2, .height = 3, .width = 3}),
        t1(b.child("t1"), {.in_channels = 2, .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1, .output_padding = 1}),
        t2(b.child("t2"), {.in_channels = 2, .out_channels = 3, .kernel = 3, .stride = 2, .output_padding = 1}),
        up(b.child("up"), {.scale = 2}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{5}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) {
    const Var<T> h = unflat(g, fc(g, x));
    return t2(g, nn::add(g, t1(g, h), up(g, h)));
  }
};

Vec ref_decoder(const Params& p, const Vec& x) {
  Image a, b, c;
  const Image s{N, 3, 3, 2};
  const Vec h = unflatten(linear(x, 5, p.at("fc.weight"), p.at("fc.bias"), 18), s);
  const Vec t1 = conv_transpose2d(h, s, p.at("t1.weight"), p.at("t1.bias"), {3, 3, 2, 2, 3, 2, 1, 1, 1}, &a);
  const Vec sum = add(t1, upsample(h, s, 2, &b));
  return conv_transpose2d(sum, a, p.at("t2.weight"), p.at("t2.bias"), {6, 6, 2, 3, 3, 2, 0, 1, 1}, &c);
}
}  // namespace

TEST_CASE_TEMPLATE("a decoder (Unflatten, ConvTranspose2d, Upsample, fan-out): every gradient vs FP64 finite differences",
                   P, O0Policy, O2BF16Policy, O2Policy) {
  CAPTURE(policy_name<P>());
  Context<host> ctx;
  nn::Model<P, host, Decoder<P, host>> model(ctx, {.max_batch = N, .seed = 7});
  const auto x = exact_inputs(N * 5, 41);
  const auto target = exact_inputs(N * 14 * 14 * 3, 42);
  auto out = model.forward(ctx, TensorView<const float>(x.data(), Shape{N, 5}));
  REQUIRE(out.shape() == Shape{N, 14, 14, 3});
  auto loss = nn::mse_loss(ctx, out, TensorView<const float>(target.data(), out.shape()));  // a loader's kind of target
  model.parameters().zero_grad();
  loss.backward();
  const Params p = consumed_values(model.parameters());
  const auto f = [&](const Params& q) { return amp::test::mse(ref_decoder(q, to_double(x)), to_double(target)); };
  CHECK(loss.item() == doctest::Approx(f(p)).epsilon(gradient_tolerance<P>()));
  check_against_differences(gradients(model.parameters()), p, f, gradient_tolerance<P>());
}

namespace {
// A net of one layer of any kind, for the refusals.
template <template <class, class> class Layer>
struct Single {
  template <class P, class B>
  struct Net {
    using T = typename P::activation_type;
    Layer<P, B> layer;
    Shape sample;
    Net(nn::Builder<P, B> b, const typename Layer<P, B>::Config& cfg, Shape s) : layer(b.child("layer"), cfg), sample(s) {}
    std::vector<nn::Input> default_inputs() const { return {{sample}}; }
    Var<T> forward(nn::Graph<P, B>& g, Var<T> x) { return layer(g, x); }
  };
};
}  // namespace

TEST_CASE("decoder layers refuse bad configurations and shapes, naming them") {
  Context<host> ctx;
  using P = O0Policy;
  using Transpose = Single<nn::ConvTranspose2d>::Net<P, host>;
  using TransposeConfig = nn::ConvTranspose2d<P, host>::Config;
  CHECK_THROWS_WITH_AS((nn::Model<P, host, Transpose>(ctx, {.max_batch = 1},
                                                      TransposeConfig{.in_channels = 2, .out_channels = 2, .stride = 2,
                                                                      .output_padding = 2},
                                                      Shape{4, 4, 2})),
                       doctest::Contains("output_padding must lie in [0, stride = 2), got 2"), Error);
  CHECK_THROWS_WITH_AS((nn::Model<P, host, Transpose>(ctx, {.max_batch = 1}, TransposeConfig{.in_channels = 2, .out_channels = 2},
                                                      Shape{4, 4, 3})),
                       doctest::Contains("is not a channels-last batch [N, H, W, 2]"), Error);
  using Up = Single<nn::Upsample>::Net<P, host>;
  CHECK_THROWS_WITH_AS((nn::Model<P, host, Up>(ctx, {.max_batch = 1}, nn::Upsample<P, host>::Config{.scale = 0}, Shape{2, 2, 1})),
                       doctest::Contains("Upsample: scale must be a positive integer, got 0"), Error);
  using Unflat = Single<nn::Unflatten>::Net<P, host>;
  CHECK_THROWS_WITH_AS((nn::Model<P, host, Unflat>(ctx, {.max_batch = 1}, nn::Unflatten<P, host>::Config{.channels = 2, .height = 3, .width = 3},
                                                   Shape{17})),
                       doctest::Contains("Unflatten: input [1x17] is not [N, 18]"), Error);
}
