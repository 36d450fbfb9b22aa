// The fused classifier loss (nn/fused_cross_entropy.hpp): loss, dL/dlogits and
// every parameter gradient equal cross_entropy's bit for bit at every level
// (tied and Linear heads, scaled by a dynamic scaler), dL/dlogits against
// FP64, the logits' gradient buffer gone from the plan, training steps equal
// bit for bit, and each misuse refused before anything is written.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "amp/amp.hpp"
#include "support/model_values.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
constexpr std::int64_t kTime = 6, kVocab = 37, kFeatures = 16, kBatch = 3, kRows = kBatch * kTime;

enum class head { tied, linear, linear_relu };

// A language model's last layers: embedding, LayerNorm, then the classifier head.
template <class P, class B, head H>
struct Lm {
  using T = typename P::activation_type;
  nn::Embedding<P, B> emb;
  nn::LayerNorm<P, B> ln;
  nn::Linear<P, B> out;
  explicit Lm(nn::Builder<P, B> b)
      : emb(b.child("emb"), {.vocab = kVocab, .features = kFeatures, .max_positions = kTime, .init_std = 0.5f}),
        ln(b.child("ln"), {.features = kFeatures}),
        out(b.child("out"), {.in_features = kFeatures, .out_features = kVocab,
                             .act = H == head::linear_relu ? activation::relu : activation::none}) {}
  std::vector<nn::Input> default_inputs() const { return {nn::indices(Shape{kTime})}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<std::int32_t> ids) {
    auto h = ln(g, emb(g, ids));
    if constexpr (H == head::tied) return emb.logits(g, h);
    else return out(g, h);
  }
};

template <class P, head H>
using LmModel = nn::Model<P, host, Lm<P, host, H>>;

std::vector<std::int32_t> ids_of(std::uint32_t seed) {
  const auto r = random_values<float>(static_cast<std::size_t>(kRows), seed, 0.0f, 1.0f);
  std::vector<std::int32_t> ids(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) ids[i] = static_cast<std::int32_t>(r[i] * kVocab) % kVocab;
  return ids;
}
TensorView<const std::int32_t> view(const std::vector<std::int32_t>& ids) { return {ids.data(), Shape{kBatch, kTime}}; }
Span<const std::int32_t> span(const std::vector<std::int32_t>& v) { return {v.data(), v.size()}; }

std::uint32_t bits(float v) {
  std::uint32_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}

template <class T, class P>
std::vector<double> grad_of(Context<host>& ctx, const nn::Output<P, host>& out) {
  const T* g = out.graph->grad(out.var);
  REQUIRE(g != nullptr);
  return to_double(download(ctx, Span<const T>(g, static_cast<std::size_t>(out.var.size()))));
}

// The worst |dL/dlogits - FP64| relative to the largest, per storage type (the
// softmax of O3 runs in fp16).
template <class T>
double logits_grad_tolerance() {
  if constexpr (std::is_same_v<T, float>) return 2e-6;
  else if constexpr (std::is_same_v<T, half>) return 4e-3;
  else return 2e-2;
}

template <class P, head H>
void fused_equals_plain() {
  using T = typename P::activation_type;
  Context<host> ctx;
  LmModel<P, H> plain(ctx, {.max_batch = kBatch, .seed = 7});
  LmModel<P, H> fused(ctx, {.max_batch = kBatch, .seed = 7, .fused_loss = true});
  DynamicLossScaler<host> scaler(ctx, {.init_scale = 1024.0f});
  const auto ids = ids_of(11), labels = ids_of(12);
  for (int iteration = 0; iteration < 2; ++iteration) {  // the second reuses the first's memory
    plain.parameters().zero_grad();
    fused.parameters().zero_grad();
    auto po = plain.forward(ctx, view(ids));
    const auto logits = to_double(download(ctx, Span<const T>(po.value().span())));
    auto pl = nn::cross_entropy(ctx, po, span(labels));
    pl.seed(scaler.scale_ptr());
    const auto plain_dlogits = grad_of<T>(ctx, po);
    plain.graph().backward();

    auto fo = fused.forward(ctx, view(ids));
    auto fl = nn::fused_cross_entropy(ctx, fo, span(labels), scaler);
    fl.seed(scaler.scale_ptr());
    const auto fused_dlogits = grad_of<T>(ctx, fo);
    fused.graph().backward();

    CHECK(bits(fl.item()) == bits(pl.item()));
    CHECK(fused_dlogits == plain_dlogits);
    const Params pg = gradients(plain.parameters()), fg = gradients(fused.parameters());
    for (const auto& [name, g] : pg) {
      CAPTURE(name);
      CHECK(fg.at(name) == g);
    }
    // dL/dlogits = 1024 (softmax - onehot) / rows, in FP64 from the logits the model made.
    std::vector<double> want(logits.size());
    double worst = 0, largest = 0, loss = 0;
    for (std::int64_t r = 0; r < kRows; ++r) {
      const double* z = logits.data() + r * kVocab;
      double m = z[0], sum = 0;
      for (std::int64_t c = 0; c < kVocab; ++c) m = std::max(m, z[c]);
      for (std::int64_t c = 0; c < kVocab; ++c) sum += std::exp(z[c] - m);
      loss += (m + std::log(sum) - z[labels[r]]) / kRows;
      for (std::int64_t c = 0; c < kVocab; ++c)
        want[r * kVocab + c] = 1024.0 * (std::exp(z[c] - m) / sum - (c == labels[r] ? 1.0 : 0.0)) / kRows;
    }
    for (std::size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(fused_dlogits[i] - want[i]));
      largest = std::max(largest, std::abs(want[i]));
    }
    CHECK(worst <= logits_grad_tolerance<T>() * largest);
    CHECK(fl.item() == doctest::Approx(loss).epsilon(logits_grad_tolerance<T>()));
  }
}
}  // namespace

TEST_CASE_TEMPLATE("fused_cross_entropy equals cross_entropy bit for bit (loss, dL/dlogits, every gradient), tied head", P,
                   O0Policy, O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  fused_equals_plain<P, head::tied>();
}

TEST_CASE_TEMPLATE("fused_cross_entropy equals cross_entropy bit for bit, Linear head", P, O0Policy, O2Policy,
                   O2BF16Policy) {
  fused_equals_plain<P, head::linear>();
}

TEST_CASE_TEMPLATE("fused_loss plans no gradient buffer for the logits: the plan shrinks by one [rows x vocab]", P,
                   O0Policy, O2Policy) {
  using T = typename P::activation_type;
  Context<host> ctx;
  LmModel<P, head::tied> plain(ctx, {.max_batch = kBatch, .seed = 7});
  LmModel<P, head::tied> fused(ctx, {.max_batch = kBatch, .seed = 7, .fused_loss = true});
  const std::size_t logits_bytes = static_cast<std::size_t>(kRows * kVocab) * sizeof(T);
  const std::size_t saved = plain.graph().arena_bytes() - fused.graph().arena_bytes();
  MESSAGE(policy_name<P>(), ": plan ", plain.graph().arena_bytes(), " -> ", fused.graph().arena_bytes(), " bytes");
  CHECK(fused.graph().arena_bytes() < plain.graph().arena_bytes());
  CHECK(saved >= logits_bytes);
  CHECK(saved < logits_bytes + 256);  // one buffer, aligned
  // Steps allocate nothing.
  const auto ids = ids_of(1), labels = ids_of(2);
  DynamicLossScaler<host> scaler(ctx);
  auto first = fused.forward(ctx, view(ids));
  nn::fused_cross_entropy(ctx, first, span(labels), scaler).backward(scaler.scale_ptr());
  const auto allocations = ctx.memory().allocations();
  for (int i = 0; i < 3; ++i) {
    auto out = fused.forward(ctx, view(ids));
    nn::fused_cross_entropy(ctx, out, span(labels), scaler).backward(scaler.scale_ptr());
  }
  CHECK(ctx.memory().allocations() == allocations);
}

TEST_CASE_TEMPLATE("training with the fused loss: the three-line steps equal cross_entropy's bit for bit", P, O0Policy,
                   O2Policy, O2BF16Policy) {
  Context<host> ctx;
  LmModel<P, head::tied> plain(ctx, {.max_batch = kBatch, .seed = 5});
  LmModel<P, head::tied> fused(ctx, {.max_batch = kBatch, .seed = 5, .fused_loss = true});
  ScalerConfig cfg = default_scaler_config<P>();
  cfg.growth_interval = 2;  // the scale changes under the steps: the forward reads it on the device each time
  optim::Adam<P, host> plain_opt(plain.parameters(), {.lr = 1e-2f}, {.scaler = cfg}),
      fused_opt(fused.parameters(), {.lr = 1e-2f}, {.scaler = cfg});
  float first = 0, last = 0;
  for (int step = 0; step < 10; ++step) {
    CAPTURE(step);
    const auto ids = ids_of(20 + static_cast<std::uint32_t>(step)), labels = ids_of(40 + static_cast<std::uint32_t>(step));
    auto po = plain.forward(ctx, view(ids));
    auto pl = nn::cross_entropy(ctx, po, span(labels));
    plain_opt.zero_grad();
    scale_loss(pl, plain_opt).backward();
    plain_opt.step();

    auto fo = fused.forward(ctx, view(ids));
    auto fl = nn::fused_cross_entropy(ctx, fo, span(labels), fused_opt);
    fused_opt.zero_grad();
    scale_loss(fl, fused_opt).backward();
    fused_opt.step();

    REQUIRE(bits(fl.item()) == bits(pl.item()));
    (step == 0 ? first : last) = fl.item();
    for (std::size_t i = 0; i < plain.parameters().table().size(); ++i)
      REQUIRE(fused.parameters().get_values(i) == plain.parameters().get_values(i));
  }
  CHECK(fused_opt.scaler().stats().scale == plain_opt.scaler().stats().scale);
  CHECK(last < first);
}

// The fused gradient is rounded to T before the weight applies: a second
// rounding, exact for a power of two but where T's subnormals lose a bit.
TEST_CASE_TEMPLATE("a weighted fused loss seeds what cross_entropy's would; a sum whose other term reads the logits is "
                   "refused", P, O0Policy, O2Policy) {
  using T = typename P::activation_type;
  Context<host> ctx;
  LmModel<P, head::tied> plain(ctx, {.max_batch = kBatch, .seed = 9});
  LmModel<P, head::tied> fused(ctx, {.max_batch = kBatch, .seed = 9, .fused_loss = true});
  DynamicLossScaler<host> scaler(ctx, {.init_scale = 256.0f});
  const auto ids = ids_of(3), labels = ids_of(4), other = ids_of(5);
  for (const bool summed : {false, true}) {
    CAPTURE(summed);
    plain.parameters().zero_grad();
    fused.parameters().zero_grad();
    auto po = plain.forward(ctx, view(ids));
    auto fo = fused.forward(ctx, view(ids));
    if (summed) {  // the other loss reads the logits before the fused loss overwrites them
      auto pa = nn::cross_entropy(ctx, po, span(other)), fa = nn::cross_entropy(ctx, fo, span(other));
      auto pl = nn::cross_entropy(ctx, po, span(labels));
      auto fl = nn::fused_cross_entropy(ctx, fo, span(labels), scaler);
      // It can no longer seed: refused before anything is written.
      CHECK_THROWS_WITH_AS((0.25f * fa + fl).backward(scaler.scale_ptr()), doctest::Contains("holds its gradient now"),
                           Error);
      CHECK(fa.item() == pa.item());  // its value stays readable
      (0.5f * pl).backward(scaler.scale_ptr());
      (0.5f * fl).backward(scaler.scale_ptr());
    } else {  // seeded, read (backward may reuse the gradient's memory), then back-propagated
      nn::cross_entropy(ctx, po, span(labels)).seed(scaler.scale_ptr(), 0.5f);
      nn::fused_cross_entropy(ctx, fo, span(labels), scaler).seed(scaler.scale_ptr(), 0.5f);
      const auto f = grad_of<T>(ctx, fo), p = grad_of<T>(ctx, po);
      double worst = 0;
      for (std::size_t i = 0; i < f.size(); ++i) worst = std::max(worst, std::abs(f[i] - p[i]));
      CHECK(worst <= (std::is_same_v<T, float> ? 0.0 : std::ldexp(1.0, -24)));  // fp16's smallest subnormal
      plain.graph().backward();
      fused.graph().backward();
    }
    const Params pg = gradients(plain.parameters()), fg = gradients(fused.parameters());
    for (const auto& [name, g] : pg) {
      CAPTURE(name);
      double worst = 0, largest = 0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        worst = std::max(worst, std::abs(fg.at(name)[i] - g[i]));
        largest = std::max(largest, std::abs(g[i]));
      }
      CHECK(worst <= (std::is_same_v<T, float> ? 0.0 : 1e-3 * largest));
    }
  }
}

TEST_CASE("fused_cross_entropy refuses misuse with a message and loses nothing") {
  using P = O2Policy;
  Context<host> ctx;
  LmModel<P, head::tied> model(ctx, {.max_batch = kBatch, .seed = 3, .fused_loss = true});
  DynamicLossScaler<host> scaler(ctx, {.init_scale = 512.0f});
  auto ids = ids_of(6), labels = ids_of(7);

  SUBCASE("a label outside the vocabulary: named, the logits untouched") {
    auto out = model.forward(ctx, view(ids));
    const auto before = download(ctx, Span<const half>(out.value().span()));
    labels[4] = kVocab;
    CHECK_THROWS_WITH_AS(nn::fused_cross_entropy(ctx, out, span(labels), scaler),
                         doctest::Contains("fused_cross_entropy: label 37 at row 4 is outside [0, 37)"), Error);
    CHECK(download(ctx, Span<const half>(out.value().span())) == before);
  }
  SUBCASE("reading the logits, or a second loss on them, after the fused loss wrote its gradient over them") {
    auto out = model.forward(ctx, view(ids));
    auto loss = nn::fused_cross_entropy(ctx, out, span(labels), scaler);
    CHECK_THROWS_WITH_AS(out.value(), doctest::Contains("holds its gradient now: fused_cross_entropy wrote dL/dx"), Error);
    CHECK_THROWS_WITH_AS(nn::cross_entropy(ctx, out, span(labels)), doctest::Contains("holds its gradient now"), Error);
    CHECK_THROWS_WITH_AS(nn::fused_cross_entropy(ctx, out, span(labels), scaler),
                         doctest::Contains("holds its gradient now"), Error);
    CHECK(std::isfinite(loss.item()));
    loss.backward(scaler.scale_ptr());  // the loss itself still back-propagates
  }
  SUBCASE("a backward scale other than the forward's: refused, then the right one works") {
    auto out = model.forward(ctx, view(ids));
    auto loss = nn::fused_cross_entropy(ctx, out, span(labels), scaler);
    CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("back-propagated with no scale other than the one its forward"),
                         Error);
    DynamicLossScaler<host> other(ctx);
    CHECK_THROWS_WITH_AS(loss.backward(other.scale_ptr()), doctest::Contains("give it the optimizer or scaler"), Error);
    model.parameters().zero_grad();
    loss.backward(scaler.scale_ptr());
    LmModel<P, head::tied> plain(ctx, {.max_batch = kBatch, .seed = 3});
    auto po = plain.forward(ctx, view(ids));
    nn::cross_entropy(ctx, po, span(labels)).backward(scaler.scale_ptr());
    CHECK(gradients(model.parameters()) == gradients(plain.parameters()));
  }
  SUBCASE("seeded twice: refused; in a sum twice: seeded once with the weights added") {
    auto out = model.forward(ctx, view(ids));
    auto loss = nn::fused_cross_entropy(ctx, out, span(labels), scaler);
    model.parameters().zero_grad();
    (0.25f * loss + 0.75f * loss).backward(scaler.scale_ptr());
    const Params summed = gradients(model.parameters());
    model.parameters().zero_grad();
    auto again = model.forward(ctx, view(ids));
    auto once = nn::fused_cross_entropy(ctx, again, span(labels), scaler);
    once.seed(scaler.scale_ptr());
    CHECK_THROWS_WITH_AS(once.seed(scaler.scale_ptr()), doctest::Contains("fused_cross_entropy: seeded already"), Error);
    model.graph().backward();
    CHECK(gradients(model.parameters()) == summed);
  }
  SUBCASE("after a refusal the next iteration trains with either loss") {
    auto out = model.forward(ctx, view(ids));
    const float fused_value = nn::fused_cross_entropy(ctx, out, span(labels), scaler).item();
    CHECK_THROWS_AS(out.value(), Error);
    auto again = model.forward(ctx, view(ids));
    auto plain = nn::cross_entropy(ctx, again, span(labels));
    const float plain_value = plain.item();
    CHECK(plain_value == fused_value);   // the same weights and batch: the same loss...
    plain.backward(scaler.scale_ptr());  // ...and a plain loss works on a fused_loss model
    auto third = model.forward(ctx, view(ids));
    CHECK(std::isfinite(nn::fused_cross_entropy(ctx, third, span(labels), scaler).item()));
  }
}

TEST_CASE("fused_cross_entropy needs logits straight from a Linear without activation or Embedding::logits") {
  Context<host> ctx;
  LmModel<O0Policy, head::linear_relu> model(ctx, {.max_batch = kBatch, .seed = 3});
  const auto ids = ids_of(6), labels = ids_of(7);
  auto out = model.forward(ctx, view(ids));
  const auto before = download(ctx, Span<const float>(out.value().span()));
  CHECK_THROWS_WITH_AS(nn::fused_cross_entropy(ctx, out, span(labels), nullptr),
                       doctest::Contains("must come straight from a Linear without activation or Embedding::logits"),
                       Error);
  CHECK(download(ctx, Span<const float>(out.value().span())) == before);  // untouched, still readable
  auto loss = nn::cross_entropy(ctx, out, span(labels));
  loss.backward();
  CHECK(std::isfinite(loss.item()));
}
