// Fused causal attention (backend/host/attention.hpp): the kernels against
// FP64 with and without dropout, across the 64-key block boundaries; the
// layer's fused and materialised paths against each other at every level
// (the same dropout bits); and activation memory linear in the context.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "amp/transformer.hpp"
#include "support/attention_launches.hpp"
#include "support/model_values.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
// A fixed key stands for the layer's RandomStream; the bits are attention_keep's.
struct FixedDropout {
  float p, keep_scale;
  std::int64_t time;
  std::uint64_t k;
  std::uint64_t key() const { return k; }
  bool keep(std::uint64_t key, std::int64_t row, std::int64_t j) const {
    return nn::detail::attention_keep(key, row, time, j, p);
  }
};

struct Attention64 {
  std::vector<double> out, lse, dq, dk, dv;
};

// The definition, in FP64: P = softmax(alpha q k^T) over j <= t, O = dropout(P) V, and its gradients.
Attention64 reference(const AttentionShape& s, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<double>& dout, const FixedDropout& drop) {
  const std::int64_t T = s.time, d = s.dim;
  Attention64 r{std::vector<double>(q.size()), std::vector<double>(static_cast<std::size_t>(s.heads * T)),
                std::vector<double>(q.size()), std::vector<double>(q.size()), std::vector<double>(q.size())};
  std::vector<double> p(static_cast<std::size_t>(T)), dp(static_cast<std::size_t>(T));
  for (std::int64_t h = 0; h < s.heads; ++h)
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t row = h * T + t, qi = (h * T + t) * d;
      double m = -1e300, l = 0, delta = 0;
      for (std::int64_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (std::int64_t e = 0; e < d; ++e) dot += q[qi + e] * k[(h * T + j) * d + e];
        p[j] = s.alpha * dot;
        m = std::max(m, p[j]);
      }
      for (std::int64_t j = 0; j <= t; ++j) l += std::exp(p[j] - m);
      r.lse[row] = m + std::log(l);
      for (std::int64_t j = 0; j <= t; ++j) {
        p[j] = std::exp(p[j] - m) / l;
        const double scale = drop.keep(drop.k, row, j) ? (drop.p > 0 ? drop.keep_scale : 1.0) : 0.0;
        double g = 0;
        for (std::int64_t e = 0; e < d; ++e) {
          r.out[qi + e] += scale * p[j] * v[(h * T + j) * d + e];
          g += dout[qi + e] * v[(h * T + j) * d + e];
        }
        dp[j] = scale * g;
        delta += p[j] * dp[j];
      }
      for (std::int64_t j = 0; j <= t; ++j) {
        const double ds = p[j] * (dp[j] - delta);
        const double scale = drop.keep(drop.k, row, j) ? (drop.p > 0 ? drop.keep_scale : 1.0) : 0.0;
        for (std::int64_t e = 0; e < d; ++e) {
          r.dq[qi + e] += s.alpha * ds * k[(h * T + j) * d + e];
          r.dk[(h * T + j) * d + e] += s.alpha * ds * q[qi + e];
          r.dv[(h * T + j) * d + e] += scale * p[j] * dout[qi + e];
        }
      }
    }
  return r;
}

// max |got - ref| relative to max |ref|: the error on the scale of the tensor
// (absolute where the reference is all zeros: a one-key softmax has no gradient).
double relative_error(const std::vector<double>& got, const std::vector<double>& ref) {
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double e = std::abs(got[i] - ref[i]);
    worst = e > worst || e != e ? e : worst;
    largest = std::max(largest, std::abs(ref[i]));
  }
  return largest > 0 ? worst / largest : worst;
}

template <class U>
std::vector<U> rounded(const std::vector<float>& v) {
  std::vector<U> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = cast<U>(v[i]);
  return out;
}

template <class U>
Buffer<U, host> buffer(Context<host>& ctx, std::size_t n) {
  return Buffer<U, host>(ctx, n, memory_kind::workspace);
}
template <class U>
Buffer<U, host> uploaded(Context<host>& ctx, const std::vector<U>& v) {
  auto b = buffer<U>(ctx, v.size());
  upload(ctx, b.span(), v);
  return b;
}

template <class G_, class O_, class D_>
struct Types {
  using G = G_;
  using O = O_;
  using D = D_;
};
using AllFp32 = Types<float, float, float>;
using Bf16In = Types<bfloat16, float, float>;   // rounded operands, fp32 results: only the kernel's own error shows
using Bf16All = Types<bfloat16, bfloat16, bfloat16>;
using Fp16All = Types<half, half, half>;

template <class U>
double kernel_tolerance() {
  return std::is_same_v<U, float> ? 2e-6 : std::is_same_v<U, half> ? 2e-3 : 1.6e-2;
}
}  // namespace

TEST_CASE_TEMPLATE("fused attention: output, log-sum-exp and gradients against FP64, with and without dropout", Ty,
                   AllFp32, Bf16In, Bf16All, Fp16All) {
  using G = typename Ty::G;
  using O = typename Ty::O;
  using D = typename Ty::D;
  Context<host> ctx(2);
  const struct {
    std::int64_t heads, time, dim;
  } shapes[] = {{3, 1, 8}, {2, 7, 12}, {2, 64, 16}, {1, 65, 32}, {4, 130, 16}, {1, 200, 64}};
  for (const auto& sh : shapes)
    for (const float p : {0.0f, 0.2f}) {
      CAPTURE(sh.heads);
      CAPTURE(sh.time);
      CAPTURE(sh.dim);
      CAPTURE(p);
      const AttentionShape s{sh.heads, sh.time, sh.dim, 1.0f / std::sqrt(static_cast<float>(sh.dim))};
      const auto n = static_cast<std::size_t>(sh.heads * sh.time * sh.dim);
      const auto seed = static_cast<std::uint32_t>(sh.time * 7 + sh.dim);
      // Scores up to about +-3 x sqrt(dim) x alpha: a peaked softmax, as trained models have.
      const auto q = rounded<G>(random_values<float>(n, seed, -1.5f, 1.5f));
      const auto k = rounded<G>(random_values<float>(n, seed + 1, -1.5f, 1.5f));
      const auto v = rounded<G>(random_values<float>(n, seed + 2));
      const auto dout = rounded<G>(random_values<float>(n, seed + 3));
      const FixedDropout drop{p, 1.0f / (1.0f - p), sh.time, 0x1234567ull + seed};
      auto qb = uploaded(ctx, q), kb = uploaded(ctx, k), vb = uploaded(ctx, v), gb = uploaded(ctx, dout);
      auto ob = buffer<O>(ctx, n);
      auto lse = buffer<float>(ctx, static_cast<std::size_t>(sh.heads * sh.time));
      auto dq = buffer<D>(ctx, n), dk = buffer<D>(ctx, n), dv = buffer<D>(ctx, n);
      attention_forward(ctx, s, qb.data(), kb.data(), vb.data(), ob.data(), lse.data(), drop);
      // dO . O in the backward reads O as stored: the reference takes it from the definition.
      attention_backward(ctx, s, qb.data(), kb.data(), vb.data(), ob.data(), lse.data(), gb.data(), dq.data(), dk.data(),
                         dv.data(), drop);
      const Attention64 ref = reference(s, to_double(q), to_double(k), to_double(v), to_double(dout), drop);
      CHECK(relative_error(to_double(download(ctx, ob.span())), ref.out) <= kernel_tolerance<O>());
      CHECK(relative_error(to_double(download(ctx, lse.span())), ref.lse) <= 2e-6);
      const double grad_tol = kernel_tolerance<D>() + kernel_tolerance<O>();  // dS reads O in its stored type
      CHECK(relative_error(to_double(download(ctx, dq.span())), ref.dq) <= grad_tol);
      CHECK(relative_error(to_double(download(ctx, dk.span())), ref.dk) <= grad_tol);
      CHECK(relative_error(to_double(download(ctx, dv.span())), ref.dv) <= kernel_tolerance<D>());
    }
}

namespace {
constexpr std::int64_t kVocab = 11, kFeatures = 32;

template <class P, class B>
struct Gpt {
  using T = typename P::activation_type;
  std::int64_t time;
  nn::Embedding<P, B> emb;
  nn::TransformerBlock<P, B> b0, b1;
  nn::LayerNorm<P, B> ln;
  Gpt(nn::Builder<P, B> b, std::int64_t context, nn::attention_kernel kernel, float dropout)
      : time(context),
        emb(b.child("emb"), {.vocab = kVocab, .features = kFeatures, .max_positions = context}),
        b0(b.child("h.0"), {.features = kFeatures, .heads = 2, .attention_dropout = dropout, .residual_dropout = dropout,
                            .attention = kernel}),
        b1(b.child("h.1"), {.features = kFeatures, .heads = 2, .attention_dropout = dropout, .residual_dropout = dropout,
                            .attention = kernel}),
        ln(b.child("ln_f"), {.features = kFeatures}) {}
  std::vector<nn::Input> default_inputs() const { return {nn::indices(Shape{time})}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<std::int32_t> ids) { return emb.logits(g, ln(g, b1(g, b0(g, emb(g, ids))))); }
};

std::vector<std::int32_t> tokens(std::size_t n, std::uint32_t seed) {
  const auto r = random_values<float>(n, seed, 0.0f, 1.0f);
  std::vector<std::int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int32_t>(r[i] * kVocab) % kVocab;
  return ids;
}
}  // namespace

TEST_CASE_TEMPLATE("attention: the fused kernel and the materialised one agree in loss and every gradient, dropout on",
                   P, O0Policy, O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  constexpr std::int64_t batch = 3, time = 70;  // past one 64-key block
  const auto ids = tokens(batch * time, 3), next = tokens(batch * time, 4);
  struct Run {
    float loss;
    Params grads;
  };
  const auto run = [&](nn::attention_kernel kernel) {
    Context<host> ctx(2);
    nn::Model<P, host, Gpt<P, host>> model(ctx, {.max_batch = batch, .seed = 5}, time, kernel, 0.1f);
    model.parameters().zero_grad();
    auto out = model.forward(ctx, TensorView<const std::int32_t>(ids.data(), Shape{batch, time}));
    auto loss = nn::cross_entropy(ctx, out, Span<const std::int32_t>(next.data(), next.size()));
    loss.backward();
    return Run{loss.item(), gradients(model.parameters())};
  };
  const Run fused = run(nn::attention_kernel::fused), materialized = run(nn::attention_kernel::materialized);
  CHECK(fused.loss == doctest::Approx(materialized.loss).epsilon(gradient_tolerance<P>()));
  REQUIRE(fused.grads.size() == materialized.grads.size());
  for (const auto& [name, g] : materialized.grads) {
    CAPTURE(name);
    CHECK(relative_error(fused.grads.at(name), g) <= gradient_tolerance<P>());
  }
}

TEST_CASE_TEMPLATE("attention: the fused kernel's planned activations grow linearly in the context, the materialised "
                   "one's quadratically", P, O0Policy, O2BF16Policy) {
  const auto planned = [](std::int64_t time, nn::attention_kernel kernel) {
    Context<host> ctx(1);
    nn::Model<P, host, Gpt<P, host>> model(ctx, {.max_batch = 2, .seed = 1}, time, kernel, 0.1f);
    return static_cast<double>(ctx.memory().peak(memory_kind::activations));
  };
  for (const auto kernel : {nn::attention_kernel::fused, nn::attention_kernel::materialized}) {
    const double a = planned(128, kernel), b = planned(256, kernel), c = planned(384, kernel);
    // The second difference is the quadratic term: 0 for O(T) memory.
    const double curvature = (c - 2 * b + a) / c;
    CAPTURE(a);
    CAPTURE(b);
    CAPTURE(c);
    if (kernel == nn::attention_kernel::fused) CHECK(std::abs(curvature) < 0.01);
    else CHECK(curvature > 0.1);
  }
}

TEST_CASE("fused attention: a head dimension past the kernel's arrays is an error naming it, and nothing runs") {
  Context<host> ctx(1);
  const AttentionShape s{1, 4, 257, 0.0625f};
  auto x = buffer<float>(ctx, static_cast<std::size_t>(4 * 257));
  auto lse = buffer<float>(ctx, 4);
  const auto launches = ctx.counters().launches;
  CHECK_THROWS_WITH_AS(attention_forward(ctx, s, x.data(), x.data(), x.data(), x.data(), lse.data(),
                                         FixedDropout{0.0f, 1.0f, 4, 0}),
                       doctest::Contains("head dimension 257 (at most 256)"), Error);
  CHECK(ctx.counters().launches == launches);
}

// The layer hands the kernels strided views (backend/attention.hpp): Q, K, V in
// place in a packed [batch, time, 3, heads, dim] buffer, O and dO in the merged
// [batch, time, heads, dim] rows, dQ, dK, dV into the packed gradient. Only the
// addresses differ from the contiguous layout, so every value must match it bit for bit.
TEST_CASE("fused attention: strided views into packed qkv and merged rows give the contiguous results bit for bit") {
  using G = amp::bfloat16;
  Context<host> ctx(2);
  constexpr std::int64_t batch = 2, heads = 3, time = 70, dim = 16, features = heads * dim;
  const float alpha = 0.25f;
  const AttentionShape flat{batch * heads, time, dim, alpha};
  const AttentionShape packed{batch * heads, time, dim, alpha, heads, 3 * features, features};
  const auto n = static_cast<std::size_t>(batch * heads * time * dim);
  std::vector<std::vector<G>> parts;  // q, k, v, dO per head
  for (std::uint32_t i = 0; i < 4; ++i) parts.push_back(rounded<G>(random_values<float>(n, 90 + i, -1.5f, 1.5f)));
  // Where element (head h, row t, e) of the contiguous layout sits in a packed one.
  const auto at = [&](std::int64_t i, std::int64_t stride) {
    const std::int64_t h = i / (time * dim), t = i / dim % time, e = i % dim;
    return static_cast<std::size_t>(packed.head_start(h, stride) + t * stride + e);
  };
  std::vector<G> qkv(3 * n), dout(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t part = 0; part < 3; ++part)
      qkv[at(static_cast<std::int64_t>(i), 3 * features) + part * features] = parts[part][i];
    dout[at(static_cast<std::int64_t>(i), features)] = parts[3][i];
  }
  for (const float p : {0.0f, 0.2f}) {
    CAPTURE(p);
    const FixedDropout drop{p, 1.0f / (1.0f - p), time, 0x5eedull};
    auto q = uploaded(ctx, parts[0]), k = uploaded(ctx, parts[1]), v = uploaded(ctx, parts[2]), g = uploaded(ctx, parts[3]);
    auto o = buffer<G>(ctx, n), dq = buffer<G>(ctx, n), dk = buffer<G>(ctx, n), dv = buffer<G>(ctx, n);
    auto lse = buffer<float>(ctx, n / dim);
    attention_forward(ctx, flat, q.data(), k.data(), v.data(), o.data(), lse.data(), drop);
    attention_backward(ctx, flat, q.data(), k.data(), v.data(), o.data(), lse.data(), g.data(), dq.data(), dk.data(),
                       dv.data(), drop);
    auto pqkv = uploaded(ctx, qkv), pdout = uploaded(ctx, dout);
    auto po = buffer<G>(ctx, n), pdqkv = buffer<G>(ctx, 3 * n);
    auto plse = buffer<float>(ctx, n / dim);
    const G* base = pqkv.data();
    attention_forward(ctx, packed, base, base + features, base + 2 * features, po.data(), plse.data(), drop);
    attention_backward(ctx, packed, base, base + features, base + 2 * features, po.data(), plse.data(), pdout.data(),
                       pdqkv.data(), pdqkv.data() + features, pdqkv.data() + 2 * features, drop);
    const auto want_o = download(ctx, o.span()), got_o = download(ctx, po.span());
    const auto got_d = download(ctx, pdqkv.span());
    const std::vector<G> want_d[3] = {download(ctx, dq.span()), download(ctx, dk.span()), download(ctx, dv.span())};
    CHECK(download(ctx, plse.span()) == download(ctx, lse.span()));
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto j = static_cast<std::int64_t>(i);
      mismatches += cast<float>(got_o[at(j, features)]) != cast<float>(want_o[i]);
      for (std::size_t part = 0; part < 3; ++part)
        mismatches += cast<float>(got_d[at(j, 3 * features) + part * features]) != cast<float>(want_d[part][i]);
    }
    CHECK(mismatches == 0);
  }
}

// The layer's own launches, counted where the code shared by both backends
// issues them: the fused path is one kernel a pass, Q, K, V read in place from
// qkv and the outputs written where they belong (the GPU adds one tiny launch
// per pass for cuDNN's dropout seed when dropout is on). Before, nine copies
// moved heads out and back around it (3 + 1 forward, 1 + 3 backward).
TEST_CASE("attention: the fused path is one launch forward and one backward, no copies of heads") {
  using P = O2BF16Policy;
  Context<host> ctx(1);
  const AttentionConfig fused_cfg{.features = kFeatures, .heads = 2};
  AttentionConfig materialized_cfg = fused_cfg;
  materialized_cfg.kernel = nn::attention_kernel::materialized;
  const Launches linears = launches_per_step<P, ItsLinears<P, host>>(ctx, fused_cfg, 70);
  const Launches fused = launches_per_step<P, AttentionAlone<P, host>>(ctx, fused_cfg, 70);
  const Launches materialized = launches_per_step<P, AttentionAlone<P, host>>(ctx, materialized_cfg, 70);
  CHECK(fused.forward - linears.forward == 1);
  CHECK(fused.backward - linears.backward == 1);
  // Materialised: split qkv, Q K^T, softmax, P V, merge; dY per head, dP, softmax', dQ, dK, dV, into dqkv.
  CHECK(materialized.forward - linears.forward == 5);
  CHECK(materialized.backward - linears.backward == 7);
}
