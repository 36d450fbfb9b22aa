// Every layer, composed as users compose them (chains, a residual block, a
// branch with fan-out, a tied weight, two losses), against an FP64 reference:
// the loss value, and every parameter's gradient against FP64 central
// differences, at every opt level. A layer's input gradient is checked through
// the parameters before it (each net starts with a layer that has some).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <tuple>

#include "amp/transformer.hpp"
#include "support/model_values.hpp"
#include "support/reference.hpp"
#include "support/reference_nn.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;
using nn::Var;

namespace {

// Builds Model<P, host, Net>, runs forward, the loss and backward, then checks
// the loss value against ref(params) and each gradient against FD of ref.
template <Policy P, template <class, class> class Net, class X, class AmpLoss, class RefLoss>
void check_net(const char* what, nn::ModelOptions options, const std::vector<X>& x, Shape x_shape, AmpLoss amp_loss,
               RefLoss ref) {
  CAPTURE(what);
  CAPTURE(policy_name<P>());
  Context<host> ctx;
  nn::Model<P, host, Net<P, host>> model(ctx, options);
  auto out = model.forward(ctx, TensorView<const X>(x.data(), x_shape));
  auto loss = amp_loss(ctx, out);
  model.parameters().zero_grad();
  loss.backward();
  const Params p = consumed_values(model.parameters());
  Vec xd(x.begin(), x.end());  // token ids as they are
  if constexpr (!std::is_same_v<X, std::int32_t>) xd = to_double(x);
  auto f = [&](const Params& q) { return ref(q, xd); };
  const double ref_loss = f(p);
  const double tol = gradient_tolerance<P>();
  CHECK(loss.item() == doctest::Approx(ref_loss).epsilon(tol));
  check_against_differences(gradients(model.parameters()), p, f, tol);
}

// ---- the nets ----------------------------------------------------------------
constexpr std::int64_t N = 4;  // batch

template <class P, class B, class Act>
struct Mlp {
  using T = typename P::activation_type;
  nn::Linear<P, B> l1, l2;
  Mlp(nn::Builder<P, B> b, activation fused = activation::none)
      : l1(b.child("l1"), {.in_features = 6, .out_features = 5, .act = fused}), l2(b.child("l2"), {.in_features = 5, .out_features = 4}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{6}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) {
    Var<T> h = l1(g, x);
    if constexpr (!std::is_void_v<Act>) h = nn::apply_activation<P, B, Act>(g, h);
    return l2(g, h);
  }
};
template <class P, class B> struct MlpFusedRelu : Mlp<P, B, void> {
  explicit MlpFusedRelu(nn::Builder<P, B> b) : Mlp<P, B, void>(b, activation::relu) {}
};
template <class P, class B> struct MlpFusedGelu : Mlp<P, B, void> {
  explicit MlpFusedGelu(nn::Builder<P, B> b) : Mlp<P, B, void>(b, activation::gelu) {}
};
template <class P, class B> using MlpTanh = Mlp<P, B, TanhFn>;
template <class P, class B> using MlpSigmoid = Mlp<P, B, SigmoidFn>;

Vec ref_mlp(const Params& p, const Vec& x, double (*act)(double)) {
  return linear(map(linear(x, 6, p.at("l1.weight"), p.at("l1.bias"), 5), act), 5, p.at("l2.weight"), p.at("l2.bias"), 4);
}

// conv(3x3, pad 1, no bias: BN follows) -> BN -> relu -> max-pool 2 -> conv(3x3, stride 2, pad 2, dilation 2, gelu fused) -> avg-pool 2
// (stride 1) -> flatten -> Linear
template <class P, class B>
struct ConvNet {
  using T = typename P::activation_type;
  nn::Conv2d<P, B> c1;
  nn::BatchNorm2d<P, B> bn;
  nn::MaxPool2d<P, B> pool;
  nn::Conv2d<P, B> c2;
  nn::AvgPool2d<P, B> avg;
  nn::Flatten<P, B> flat;
  nn::Linear<P, B> fc;
  explicit ConvNet(nn::Builder<P, B> b)
      : c1(b.child("c1"), {.in_channels = 2, .out_channels = 4, .kernel = 3, .padding = 1, .bias = false}),
        bn(b.child("bn"), {.features = 4}),
        pool(b.child("pool"), {.kernel = 2}),
        c2(b.child("c2"), {.in_channels = 4, .out_channels = 3, .kernel = 3, .stride = 2, .padding = 2, .dilation = 2,
                           .act = activation::gelu}),
        avg(b.child("avg"), {.kernel = 2, .stride = 1}),
        flat(b.child("flat"), {}),
        fc(b.child("fc"), {.in_features = 3, .out_features = 5}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{8, 8, 2}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) {
    return fc(g, flat(g, avg(g, c2(g, pool(g, nn::relu(g, bn(g, c1(g, x))))))));
  }
};

Vec ref_conv_net(const Params& p, const Vec& x) {
  Image s{N, 8, 8, 2}, s1, s2, s3, s4;
  Vec h = conv2d(x, s, p.at("c1.weight"), {}, 4, 3, 1, 1, 1, &s1);
  h = map(batchnorm(h, 4, p.at("bn.weight"), p.at("bn.bias"), 1e-5), relu);
  h = pool(h, s1, 2, 2, 0, true, &s2);
  h = map(conv2d(h, s2, p.at("c2.weight"), p.at("c2.bias"), 3, 3, 2, 2, 2, &s3), gelu);
  h = pool(h, s3, 2, 1, 0, false, &s4);
  return linear(flatten(h, s4), s4.h * s4.w * s4.c, p.at("fc.weight"), p.at("fc.bias"), 5);
}

// Wide enough for the host's vector paths: a one-channel image (im2col's
// constant-width copy), col2im over 20 channels (a block of 16 and a rest), and
// column sums over 16 channels (BatchNorm's per-column, LayerNorm's per-row
// statistics). Smooth (no relu, no max): at bf16 a kink that rounding moves
// across an input would dominate the gradient error.
template <class P, class B>
struct WideConvNet {
  using T = typename P::activation_type;
  nn::Conv2d<P, B> c1, c2;
  nn::BatchNorm2d<P, B> bn1, bn2;
  nn::AvgPool2d<P, B> pool;
  nn::LayerNorm<P, B> ln;
  nn::GlobalAvgPool<P, B> gap;
  nn::Linear<P, B> fc;
  explicit WideConvNet(nn::Builder<P, B> b)
      : c1(b.child("c1"), {.in_channels = 1, .out_channels = 20, .kernel = 3, .padding = 1, .bias = false}),
        c2(b.child("c2"), {.in_channels = 20, .out_channels = 16, .kernel = 3, .padding = 1, .bias = false}),
        bn1(b.child("bn1"), {.features = 20}),
        bn2(b.child("bn2"), {.features = 16}),
        pool(b.child("pool"), {.kernel = 2}),
        ln(b.child("ln"), {.features = 16}),
        gap(b.child("gap"), {}),
        fc(b.child("fc"), {.in_features = 16, .out_features = 3}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{6, 6, 1}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) {
    return fc(g, gap(g, ln(g, bn2(g, c2(g, pool(g, bn1(g, c1(g, x))))))));
  }
};

Vec ref_wide_conv_net(const Params& p, const Vec& x) {
  Image s{N, 6, 6, 1}, s1, s2, s3;
  Vec h = conv2d(x, s, p.at("c1.weight"), {}, 20, 3, 1, 1, 1, &s1);
  h = pool(batchnorm(h, 20, p.at("bn1.weight"), p.at("bn1.bias"), 1e-5), s1, 2, 2, 0, false, &s2);
  h = conv2d(h, s2, p.at("c2.weight"), {}, 16, 3, 1, 1, 1, &s3);
  h = layernorm(batchnorm(h, 16, p.at("bn2.weight"), p.at("bn2.bias"), 1e-5), 16, p.at("ln.weight"), p.at("ln.bias"), 1e-5);
  return linear(global_avg(h, s3), 16, p.at("fc.weight"), p.at("fc.bias"), 3);
}

// A residual block: stem 1x1 conv, then conv-BN-relu-conv-BN plus the skip, relu, global average, Linear.
template <class P, class B>
struct ResNet {
  using T = typename P::activation_type;
  nn::Conv2d<P, B> stem, c1, c2;
  nn::BatchNorm2d<P, B> bn1, bn2;
  nn::GlobalAvgPool<P, B> gap;
  nn::Linear<P, B> fc;
  explicit ResNet(nn::Builder<P, B> b)
      : stem(b.child("stem"), {.in_channels = 2, .out_channels = 3, .kernel = 1}),
        c1(b.child("c1"), {.in_channels = 3, .out_channels = 3, .kernel = 3, .padding = 1, .bias = false}),
        c2(b.child("c2"), {.in_channels = 3, .out_channels = 3, .kernel = 3, .padding = 1, .bias = false}),
        bn1(b.child("bn1"), {.features = 3}),
        bn2(b.child("bn2"), {.features = 3}),
        gap(b.child("gap"), {}),
        fc(b.child("fc"), {.in_features = 3, .out_features = 4}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{5, 5, 2}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) {
    const Var<T> s = stem(g, x);  // read twice: by the block and by the skip
    const Var<T> h = bn2(g, c2(g, nn::relu(g, bn1(g, c1(g, s)))));
    return fc(g, gap(g, nn::relu(g, nn::add(g, h, s))));
  }
};

Vec ref_res_net(const Params& p, const Vec& x) {
  Image s{N, 5, 5, 2}, s0, s1;
  const Vec stem = conv2d(x, s, p.at("stem.weight"), p.at("stem.bias"), 3, 1, 1, 0, 1, &s0);
  Vec h = map(batchnorm(conv2d(stem, s0, p.at("c1.weight"), {}, 3, 3, 1, 1, 1, &s1), 3, p.at("bn1.weight"), p.at("bn1.bias"), 1e-5), relu);
  h = batchnorm(conv2d(h, s1, p.at("c2.weight"), {}, 3, 3, 1, 1, 1, &s1), 3, p.at("bn2.weight"), p.at("bn2.bias"), 1e-5);
  return linear(global_avg(map(add(h, stem), relu), s1), 3, p.at("fc.weight"), p.at("fc.bias"), 4);
}

// A branch with fan-out: h = LayerNorm(Linear(x)) feeds relu and tanh, concatenated, then Linear.
template <class P, class B>
struct Branch {
  using T = typename P::activation_type;
  nn::Linear<P, B> in, out;
  nn::LayerNorm<P, B> ln;
  explicit Branch(nn::Builder<P, B> b)
      : in(b.child("in"), {.in_features = 6, .out_features = 5}),
        out(b.child("out"), {.in_features = 10, .out_features = 3}),
        ln(b.child("ln"), {.features = 5}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{6}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) {
    const Var<T> h = ln(g, in(g, x));
    return out(g, nn::concat(g, nn::relu(g, h), nn::apply_activation<P, B, TanhFn>(g, h)));
  }
};

Vec ref_branch(const Params& p, const Vec& x) {
  const Vec h = layernorm(linear(x, 6, p.at("in.weight"), p.at("in.bias"), 5), 5, p.at("ln.weight"), p.at("ln.bias"), 1e-5);
  return linear(concat(map(h, relu), 5, map(h, tanh_), 5), 10, p.at("out.weight"), p.at("out.bias"), 3);
}

// RMSNorm between two Linears, 16 wide (the host's vector paths), then GELU.
template <class P, class B>
struct RmsNet {
  using T = typename P::activation_type;
  nn::Linear<P, B> in, out;
  nn::RMSNorm<P, B> norm;
  explicit RmsNet(nn::Builder<P, B> b)
      : in(b.child("in"), {.in_features = 6, .out_features = 16}),
        out(b.child("out"), {.in_features = 16, .out_features = 3}),
        norm(b.child("norm"), {.features = 16}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{6}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) { return out(g, nn::gelu(g, norm(g, in(g, x)))); }
};

Vec ref_rms_net(const Params& p, const Vec& x) {
  const Vec h = rmsnorm(linear(x, 6, p.at("in.weight"), p.at("in.bias"), 16), 16, p.at("norm.weight"), 1e-5);
  return linear(map(h, gelu), 16, p.at("out.weight"), p.at("out.bias"), 3);
}

// One weight used twice (tied): y = head(L(relu(L(x)))).
template <class P, class B>
struct Tied {
  using T = typename P::activation_type;
  nn::Linear<P, B> shared, head;
  explicit Tied(nn::Builder<P, B> b)
      : shared(b.child("shared"), {.in_features = 5, .out_features = 5}), head(b.child("head"), {.in_features = 5, .out_features = 3}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{5}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) { return head(g, shared(g, nn::relu(g, shared(g, x)))); }
};

Vec ref_tied(const Params& p, const Vec& x) {
  const Vec& w = p.at("shared.weight");
  const Vec& b = p.at("shared.bias");
  return linear(linear(map(linear(x, 5, w, b, 5), relu), 5, w, b, 5), 5, p.at("head.weight"), p.at("head.bias"), 3);
}

// Two heads on one trunk, two losses summed in one backward (an auxiliary head).
template <class P, class B>
struct TwoHeads {
  using T = typename P::activation_type;
  nn::Linear<P, B> trunk, a, b;
  explicit TwoHeads(nn::Builder<P, B> bl)
      : trunk(bl.child("trunk"), {.in_features = 6, .out_features = 5, .act = activation::relu}),
        a(bl.child("a"), {.in_features = 5, .out_features = 4}),
        b(bl.child("b"), {.in_features = 5, .out_features = 2}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{6}}}; }
  std::tuple<Var<T>, Var<T>> forward(nn::Graph<P, B>& g, Var<T> x) {
    const Var<T> h = trunk(g, x);
    return {a(g, h), b(g, h)};
  }
};

// Transformers over [N, T, features]: attention alone, a whole pre-LN block, and a
// tiny GPT (token and position embeddings, a block, the tied output projection).
constexpr std::int64_t T = 5;

template <class P, class B>
struct AttentionNet {
  using Tv = typename P::activation_type;
  nn::Linear<P, B> in, out;
  nn::CausalSelfAttention<P, B> attn;
  explicit AttentionNet(nn::Builder<P, B> b)
      : in(b.child("in"), {.in_features = 4, .out_features = 8}), out(b.child("out"), {.in_features = 8, .out_features = 3}),
        attn(b.child("attn"), {.features = 8, .heads = 2}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{T, 4}}}; }
  Var<Tv> forward(nn::Graph<P, B>& g, Var<Tv> x) { return out(g, attn(g, in(g, x))); }
};

Vec ref_attention(const Params& p, const Vec& h, const std::string& at) {
  const Vec qkv = linear(h, 8, p.at(at + ".c_attn.weight"), p.at(at + ".c_attn.bias"), 24);
  return linear(causal_attention(qkv, N, T, 8, 2), 8, p.at(at + ".c_proj.weight"), p.at(at + ".c_proj.bias"), 8);
}

Vec ref_block(const Params& p, const Vec& x, const std::string& at) {
  const Vec a = add(x, ref_attention(p, layernorm(x, 8, p.at(at + ".ln_1.weight"), p.at(at + ".ln_1.bias"), 1e-5), at + ".attn"));
  const Vec h = layernorm(a, 8, p.at(at + ".ln_2.weight"), p.at(at + ".ln_2.bias"), 1e-5);
  const Vec m = linear(map(linear(h, 8, p.at(at + ".mlp.c_fc.weight"), p.at(at + ".mlp.c_fc.bias"), 16), gelu), 16,
                       p.at(at + ".mlp.c_proj.weight"), p.at(at + ".mlp.c_proj.bias"), 8);
  return add(a, m);
}

template <class P, class B>
struct BlockNet {
  using Tv = typename P::activation_type;
  nn::Linear<P, B> in, out;
  nn::TransformerBlock<P, B> block;
  explicit BlockNet(nn::Builder<P, B> b)
      : in(b.child("in"), {.in_features = 4, .out_features = 8}), out(b.child("out"), {.in_features = 8, .out_features = 3}),
        block(b.child("block"), {.features = 8, .heads = 2, .mlp_ratio = 2}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{T, 4}}}; }
  Var<Tv> forward(nn::Graph<P, B>& g, Var<Tv> x) { return out(g, block(g, in(g, x))); }
};

template <class P, class B>
struct TinyGpt {
  using Tv = typename P::activation_type;
  nn::Embedding<P, B> emb;
  nn::TransformerBlock<P, B> block;
  nn::LayerNorm<P, B> ln;
  explicit TinyGpt(nn::Builder<P, B> b)
      : emb(b.child("emb"), {.vocab = 7, .features = 8, .max_positions = T, .init_std = 0.5f}),
        block(b.child("block"), {.features = 8, .heads = 2, .mlp_ratio = 2}),
        ln(b.child("ln"), {.features = 8}) {}
  std::vector<nn::Input> default_inputs() const { return {nn::indices(Shape{T})}; }
  Var<Tv> forward(nn::Graph<P, B>& g, Var<std::int32_t> ids) { return emb.logits(g, ln(g, block(g, emb(g, ids)))); }
};

Vec ref_gpt(const Params& p, const Vec& ids) {
  const Vec& w = p.at("emb.weight");
  Vec x(static_cast<std::size_t>(N * T * 8));
  for (std::int64_t r = 0; r < N * T; ++r)
    for (std::int64_t c = 0; c < 8; ++c)
      x[r * 8 + c] = w[static_cast<std::int64_t>(ids[r]) * 8 + c] + p.at("emb.positions")[(r % T) * 8 + c];
  const Vec h = layernorm(ref_block(p, x, "block"), 8, p.at("ln.weight"), p.at("ln.bias"), 1e-5);
  return linear(h, 8, w, {}, 7);
}

const std::vector<std::int32_t> labels{1, 3, 0, 2};
const std::vector<std::int32_t> labels3{1, 2, 0, 2};  // three classes

template <Policy P>
void check_all() {
  const auto x6 = exact_inputs(N * 6, 11);
  const auto t4 = exact_inputs(N * 4, 12);
  auto t01 = random_values<float>(N * 4, 13, 0.0f, 1.0f);
  const Span<const std::int32_t> y{labels.data(), labels.size()};
  const auto ce = [&](Context<host>& c, const auto& out) { return nn::cross_entropy(c, out, y); };
  const auto mse = [&](Context<host>& c, const auto& out) { return nn::mse_loss(c, out, matrix<const float>(t4.data(), N, 4)); };
  const auto bce = [&](Context<host>& c, const auto& out) {
    return nn::bce_with_logits(c, out, matrix<const float>(t01.data(), N, 4));
  };
  const Shape s6{N, 6};
  SUBCASE("mlp relu (fused), mse") {
    check_net<P, MlpFusedRelu>("mlp relu (fused), mse", {.max_batch = N, .seed = 3}, x6, s6, mse,
                               [&](const Params& p, const Vec& x) { return amp::test::mse(ref_mlp(p, x, relu), to_double(t4)); });
  }
  SUBCASE("mlp gelu (fused), cross-entropy") {
    check_net<P, MlpFusedGelu>("mlp gelu (fused), cross-entropy", {.max_batch = N, .seed = 3}, x6, s6, ce,
                               [&](const Params& p, const Vec& x) { return cross_entropy(ref_mlp(p, x, gelu), 4, labels); });
  }
  SUBCASE("mlp tanh, bce") {
    check_net<P, MlpTanh>("mlp tanh, bce", {.max_batch = N, .seed = 3}, x6, s6, bce,
                          [&](const Params& p, const Vec& x) { return amp::test::bce(ref_mlp(p, x, tanh_), to_double(t01)); });
  }
  SUBCASE("mlp sigmoid, cross-entropy") {
    check_net<P, MlpSigmoid>("mlp sigmoid, cross-entropy", {.max_batch = N, .seed = 3}, x6, s6, ce,
                             [&](const Params& p, const Vec& x) { return cross_entropy(ref_mlp(p, x, sigmoid), 4, labels); });
  }
  SUBCASE("conv, batchnorm, pools, flatten") {
    check_net<P, ConvNet>("conv, batchnorm, pools, flatten", {.max_batch = N, .seed = 4}, exact_inputs(N * 8 * 8 * 2, 21),
                          Shape{N, 8, 8, 2}, [&](Context<host>& c, const auto& out) {
                            const Span<const std::int32_t> y5{labels.data(), labels.size()};
                            return nn::cross_entropy(c, out, y5);
                          },
                          [&](const Params& p, const Vec& x) { return cross_entropy(ref_conv_net(p, x), 5, labels); });
  }
  SUBCASE("wide conv: vector paths of im2col, col2im and column sums") {
    check_net<P, WideConvNet>("wide conv: vector paths of im2col, col2im and column sums", {.max_batch = N, .seed = 12},
                              exact_inputs(N * 6 * 6, 23), Shape{N, 6, 6, 1},
                              [&](Context<host>& c, const auto& out) {
                                const Span<const std::int32_t> y3{labels3.data(), labels3.size()};
                                return nn::cross_entropy(c, out, y3);
                              },
                              [&](const Params& p, const Vec& x) { return cross_entropy(ref_wide_conv_net(p, x), 3, labels3); });
  }
  SUBCASE("residual block") {
    check_net<P, ResNet>("residual block", {.max_batch = N, .seed = 5}, exact_inputs(N * 5 * 5 * 2, 22), Shape{N, 5, 5, 2},
                         ce, [&](const Params& p, const Vec& x) { return cross_entropy(ref_res_net(p, x), 4, labels); });
  }
  const auto t3 = exact_inputs(N * 3, 14);
  SUBCASE("branch with fan-out, layernorm, concat") {
    check_net<P, Branch>("branch with fan-out, layernorm, concat", {.max_batch = N, .seed = 6}, x6, s6,
                         [&](Context<host>& c, const auto& out) { return nn::mse_loss(c, out, matrix<const float>(t3.data(), N, 3)); },
                         [&](const Params& p, const Vec& x) { return amp::test::mse(ref_branch(p, x), to_double(t3)); });
  }
  SUBCASE("RMSNorm (Apex FusedRMSNorm)") {
    check_net<P, RmsNet>("RMSNorm (Apex FusedRMSNorm)", {.max_batch = N, .seed = 13}, x6, s6,
                         [&](Context<host>& c, const auto& out) { return nn::mse_loss(c, out, matrix<const float>(t3.data(), N, 3)); },
                         [&](const Params& p, const Vec& x) { return amp::test::mse(ref_rms_net(p, x), to_double(t3)); });
  }
  const auto x5 = exact_inputs(N * 5, 15);
  SUBCASE("tied weight") {
    check_net<P, Tied>("tied weight", {.max_batch = N, .seed = 7}, x5, Shape{N, 5},
                       [&](Context<host>& c, const auto& out) { return nn::mse_loss(c, out, matrix<const float>(t3.data(), N, 3)); },
                       [&](const Params& p, const Vec& x) { return amp::test::mse(ref_tied(p, x), to_double(t3)); });
  }
  std::vector<std::int32_t> rows_labels(N * T), ids(N * T);
  for (std::int64_t r = 0; r < N * T; ++r) rows_labels[r] = static_cast<std::int32_t>((r * 7 + 2) % 3), ids[r] = static_cast<std::int32_t>((r * 5 + 1) % 7);
  const Span<const std::int32_t> y_rows{rows_labels.data(), rows_labels.size()};
  const auto ce_rows = [&](Context<host>& c, const auto& out) { return nn::cross_entropy(c, out, y_rows); };
  const auto xt = exact_inputs(N * T * 4, 17);
  SUBCASE("causal self-attention") {
    check_net<P, AttentionNet>("causal self-attention", {.max_batch = N, .seed = 9}, xt, Shape{N, T, 4}, ce_rows,
                               [&](const Params& p, const Vec& x) {
                                 const Vec h = linear(x, 4, p.at("in.weight"), p.at("in.bias"), 8);
                                 return cross_entropy(linear(ref_attention(p, h, "attn"), 8, p.at("out.weight"),
                                                             p.at("out.bias"), 3), 3, rows_labels);
                               });
  }
  SUBCASE("pre-LN transformer block") {
    check_net<P, BlockNet>("pre-LN transformer block", {.max_batch = N, .seed = 10}, xt, Shape{N, T, 4}, ce_rows,
                           [&](const Params& p, const Vec& x) {
                             const Vec h = linear(x, 4, p.at("in.weight"), p.at("in.bias"), 8);
                             return cross_entropy(linear(ref_block(p, h, "block"), 8, p.at("out.weight"),
                                                         p.at("out.bias"), 3), 3, rows_labels);
                           });
  }
  std::vector<std::int32_t> next(N * T);
  for (std::int64_t r = 0; r < N * T; ++r) next[r] = ids[(r + 1) % (N * T)];
  SUBCASE("tiny GPT: embeddings, a block, tied output projection") {
    check_net<P, TinyGpt>("tiny GPT: embeddings, a block, tied output projection", {.max_batch = N, .seed = 11}, ids,
                          Shape{N, T},
                          [&](Context<host>& c, const auto& out) {
                            return nn::cross_entropy(c, out, Span<const std::int32_t>{next.data(), next.size()});
                          },
                          [&](const Params& p, const Vec& x) { return cross_entropy(ref_gpt(p, x), 7, next); });
  }
  const auto t2 = exact_inputs(N * 2, 16);
  SUBCASE("two losses in one backward") {
    check_net<P, TwoHeads>(
        "two losses in one backward", {.max_batch = N, .seed = 8}, x6, s6,
        [&](Context<host>& c, const auto& outs) {
          return nn::cross_entropy(c, std::get<0>(outs), y) +
                 0.5f * nn::mse_loss(c, std::get<1>(outs), matrix<const float>(t2.data(), N, 2));
        },
        [&](const Params& p, const Vec& x) {
          const Vec h = map(linear(x, 6, p.at("trunk.weight"), p.at("trunk.bias"), 5), relu);
          return cross_entropy(linear(h, 5, p.at("a.weight"), p.at("a.bias"), 4), 4, labels) +
                 0.5 * amp::test::mse(linear(h, 5, p.at("b.weight"), p.at("b.bias"), 2), to_double(t2));
        });
  }
}

}  // namespace

TEST_CASE_TEMPLATE("layers and compositions: loss vs FP64, every gradient vs FP64 finite differences", P, O0Policy,
                   O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  check_all<P>();
}

TEST_CASE("bad shapes are refused with the layer and the shapes named") {
  Context<host> ctx;
  nn::Sequential<O0Policy, host, nn::Linear> model(ctx, {.max_batch = 4, .seed = 1},
                                                   {.in_features = 3, .out_features = 2, .bias = false});
  CHECK(model.parameters().table().size() == 1);  // no bias
  std::vector<float> x{1, 2, 3, 4, 5, 6};
  auto y = model.forward(ctx, matrix<const float>(x.data(), 2, 3));
  const auto w = download(ctx, Span<const float>(model.parameters().arena<nn::role::weight>().values()));
  const auto got = download(ctx, Span<const float>(y.var.span()));
  CHECK(got[0] == doctest::Approx(w[0] * 1 + w[1] * 2 + w[2] * 3));
  CHECK(got[3] == doctest::Approx(w[3] * 4 + w[4] * 5 + w[5] * 6));

  CHECK_THROWS_WITH_AS(model.forward(ctx, matrix<const float>(x.data(), 3, 2)),
                       doctest::Contains("input 0 has shape [3x2], expected [batch x 3]"), Error);
  std::vector<float> big(15);
  CHECK_THROWS_WITH_AS(model.forward(ctx, matrix<const float>(big.data(), 5, 3)), doctest::Contains("batch in 1..4"), Error);
  std::vector<float> t(6);
  CHECK_THROWS_WITH_AS(nn::mse_loss(ctx, y, matrix<const float>(t.data(), 3, 2)),
                       doctest::Contains("prediction [2x2] and target [3x2] differ"), Error);
  std::vector<std::int32_t> bad{0, 2};
  CHECK_THROWS_WITH_AS(nn::cross_entropy(ctx, y, Span<const std::int32_t>{bad.data(), 2}),
                       doctest::Contains("label 2 at row 1 is outside [0, 2)"), Error);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(ctx, y, Span<const std::int32_t>{bad.data(), 1}),
                       doctest::Contains("1 labels for a prediction of 2 rows"), Error);
  // Shapes that do not chain fail when the model is built (its planning pass), naming the layer.
  CHECK_THROWS_WITH_AS((nn::Sequential<O0Policy, host, nn::Linear, nn::Linear>(
                           ctx, {}, {.in_features = 3, .out_features = 2}, {.in_features = 4, .out_features = 1})),
                       doctest::Contains("Linear '1.' (4 -> 1): input [128x2] does not end in 4 features"), Error);
  CHECK_THROWS_WITH_AS((nn::Sequential<O0Policy, host, nn::Conv2d>(ctx, {.max_batch = 2, .inputs = {{Shape{6, 6, 2}}}},
                                                                   {.in_channels = 3, .out_channels = 4})),
                       doctest::Contains("Conv2d '0.' (3 -> 4 channels): input [2x6x6x2]"), Error);
  CHECK_THROWS_WITH_AS((nn::Sequential<O0Policy, host, nn::BatchNorm2d>(ctx, {.max_batch = 2, .inputs = {{Shape{6, 6, 2}}}},
                                                                        {.features = 3})),
                       doctest::Contains("BatchNorm '0.' (3 channels): input [2x6x6x2]"), Error);
  CHECK_THROWS_WITH_AS((nn::Sequential<O0Policy, host, nn::MaxPool2d>(ctx, {.max_batch = 2, .inputs = {{Shape{1, 1, 2}}}},
                                                                      {.kernel = 3})),
                       doctest::Contains("window does not fit the input [2x1x1x2]"), Error);
}

TEST_CASE("batchnorm: running statistics in training, used in evaluation; dropout masks and scales") {
  Context<host> ctx;
  nn::Sequential<O0Policy, host, nn::BatchNorm1d, nn::Dropout> model(ctx, {.max_batch = 4, .seed = 2, .inputs = {{Shape{2}}}},
                                                                      {.features = 2, .momentum = 0.5f}, {.p = 0.5f});
  auto& store = model.parameters();
  const auto rm = model.layer<0>().running_mean(), rv = model.layer<0>().running_var();
  CHECK(store.get_values(rm.index) == std::vector<float>{0, 0});  // the planning pass leaves no trace
  CHECK(store.get_values(rv.index) == std::vector<float>{1, 1});
  std::vector<float> x{1, 10, 2, 20, 3, 30, 6, 40};
  model.forward(ctx, matrix<const float>(x.data(), 4, 2));
  // column 0: mean 3, biased var 3.5, unbiased 14/3; momentum 0.5
  CHECK(store.get_values(rm.index)[0] == doctest::Approx(1.5));
  CHECK(store.get_values(rv.index)[0] == doctest::Approx(0.5 + 0.5 * 14.0 / 3.0));
  // Dropout zeroes about half of the elements and doubles the rest.
  std::vector<float> ones(4 * 2, 1.0f);
  model.eval();
  auto y = download(ctx, Span<const float>(model.forward(ctx, matrix<const float>(ones.data(), 4, 2)).var.span()));
  const float m = store.get_values(rm.index)[0], v = store.get_values(rv.index)[0];
  CHECK(y[0] == doctest::Approx((1.0 - m) / std::sqrt(v + 1e-5)));  // running statistics, and no dropout
  model.train();
  nn::Sequential<O0Policy, host, nn::Dropout> drop(ctx, {.max_batch = 1000, .seed = 4, .inputs = {{Shape{10}}}}, {.p = 0.25f});
  std::vector<float> many(10000, 1.0f);
  const auto d = download(ctx, Span<const float>(drop.forward(ctx, matrix<const float>(many.data(), 1000, 10)).var.span()));
  std::size_t zeros = 0;
  for (const float e : d) {
    zeros += e == 0.0f;
    REQUIRE((e == 0.0f || e == doctest::Approx(1.0 / 0.75)));
  }
  CHECK(zeros == doctest::Approx(2500).epsilon(0.08));
}

TEST_CASE("initialisation is deterministic, bounded and independent of the thread count") {
  Context<host> one(1), two(2);
  auto make = [](Context<host>& ctx) {
    return std::make_unique<nn::Sequential<O2Policy, host, nn::Linear>>(
        ctx, nn::ModelOptions{.max_batch = 2, .seed = 9}, nn::Linear<O2Policy, host>::Config{.in_features = 300, .out_features = 200});
  };
  auto a = make(one);
  auto b = make(two);
  const auto ma = download(one, Span<const float>(a->parameters().arena<nn::role::weight>().master()));
  const auto mb = download(two, Span<const float>(b->parameters().arena<nn::role::weight>().master()));
  CHECK(ma == mb);
  const float bound = std::sqrt(6.0f / 300.0f);
  double mean = 0, sq = 0;
  for (std::size_t i = 0; i < 60000; ++i) {
    REQUIRE(std::abs(ma[i]) <= bound);
    mean += ma[i];
    sq += ma[i] * ma[i];
  }
  mean /= 60000;
  CHECK(std::abs(mean) < 0.01 * bound);
  CHECK(sq / 60000 == doctest::Approx(bound * bound / 3).epsilon(0.02));  // variance of U(-b, b)
  // The fp16 weights are the rounded master.
  const auto w = download(one, Span<const half>(a->parameters().arena<nn::role::weight>().values()));
  for (std::size_t i = 0; i < ma.size(); ++i) REQUIRE(detail::bits(w[i]) == detail::bits(cast<half>(ma[i])));
  // PyTorch's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  nn::Sequential<O0Policy, host, nn::Linear> torch_like(one, {.max_batch = 1, .seed = 3},
                                                        {.in_features = 400, .out_features = 50, .init = nn::initializer::torch_default});
  float largest = 0;
  for (const float v : torch_like.parameters().get_values(0)) largest = std::max(largest, std::abs(v));
  CHECK(largest <= 0.05f);
  CHECK(largest > 0.049f);
}

namespace {
// The spacing of T's values at |x| (one unit in the last place).
template <class T>
double ulp_of(double x) {
  const double a = std::max(std::abs(x), static_cast<double>(cast<float>(limits<T>::min_normal())));
  return std::ldexp(1.0, std::ilogb(a) - (limits<T>::digits - 1));
}
}  // namespace

TEST_CASE_TEMPLATE("Linear rounds its output once: within half an ulp of the exact x W^T + b", P, O0Policy, O1Policy,
                   O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  using T = typename P::activation_type;
  using G = typename P::template compute_type<op::gemm>;
  constexpr std::int64_t rows = 16, in = 64, out = 48;
  Context<host> ctx;
  nn::Sequential<P, host, nn::Linear> model(ctx, {.max_batch = rows, .seed = 2}, {.in_features = in, .out_features = out});
  const auto xf = exact_inputs(rows * in, 41);
  const auto y = download(ctx, Span<const T>(model.forward(ctx, matrix<const float>(xf.data(), rows, in)).var.span()));
  // What the GEMM multiplies: the weights and bias as compute_type<gemm> (O1: the cast cache).
  auto& layer = model.template layer<0>();
  const auto w = download(ctx, model.parameters().template as<G>(layer.weight()));
  const auto b = download(ctx, model.parameters().template as<G>(layer.bias()));
  int over = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < out; ++j) {
      double exact = cast<float>(b[j]), magnitude = std::abs(exact);
      for (std::int64_t i = 0; i < in; ++i) {
        const double p = static_cast<double>(xf[r * in + i]) * cast<float>(w[j * in + i]);
        exact += p, magnitude += std::abs(p);
      }
      const double accumulation = 2.0 * in * unit_roundoff<float> * magnitude;  // fp32 sums, before the rounding
      const double err = std::abs(cast<float>(y[r * out + j]) - exact);
      if (err > 0.5 * ulp_of<T>(exact) + accumulation) ++over;
    }
  CHECK(over == 0);
}
