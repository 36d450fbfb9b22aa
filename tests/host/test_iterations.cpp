// Several forwards of one model before one backward (a GAN's discriminator on
// the real and the fake batch, a siamese pair), and handles that cannot go
// stale: against FP64 finite differences and against separate iterations, at
// every opt level.
#include <doctest/doctest.h>

#include <tuple>

#include "amp/amp.hpp"
#include "support/model_values.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;
using nn::Var;

namespace {
constexpr std::int64_t N = 4;

// Linear 6-5 (no bias: BatchNorm follows), BatchNorm (each forward's own batch statistics), ReLU, Linear 5-2.
template <class P, class B>
struct Critic {
  using T = typename P::activation_type;
  nn::Linear<P, B> l1;
  nn::BatchNorm<P, B> bn;
  nn::Linear<P, B> l2;
  explicit Critic(nn::Builder<P, B> b)
      : l1(b.child("l1"), {.in_features = 6, .out_features = 5, .bias = false}), bn(b.child("bn"), {.features = 5}),
        l2(b.child("l2"), {.in_features = 5, .out_features = 2}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{6}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) { return l2(g, nn::relu(g, bn(g, l1(g, x)))); }
};

Vec ref_critic(const Params& p, const Vec& x) {
  const Vec h = batchnorm(linear(x, 6, p.at("l1.weight"), {}, 5), 5, p.at("bn.weight"), p.at("bn.bias"), 1e-5);
  return linear(map(h, relu), 5, p.at("l2.weight"), p.at("l2.bias"), 2);
}

template <Policy P>
using CriticModel = nn::Model<P, host, Critic<P, host>>;

struct Batches {
  std::vector<float> real = exact_inputs(N * 6, 31), fake = exact_inputs(N * 6, 32);
  std::vector<float> ones = std::vector<float>(N * 2, 1.0f), zeros = std::vector<float>(N * 2, 0.0f);
  Matrix<const float> x(const std::vector<float>& v) const { return matrix<const float>(v.data(), N, 6); }
  Matrix<const float> y(const std::vector<float>& v) const { return matrix<const float>(v.data(), N, 2); }
};

template <Policy P>
std::vector<float> running_means(CriticModel<P>& m) {
  return download(m.context(), Span<const float>(m.parameters().values(m.net().bn.running_mean())));
}
}  // namespace

TEST_CASE_TEMPLATE("a GAN's critic on the real and the fake batch, one backward: FP64 differences and two iterations",
                   P, O0Policy, O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  Context<host> ctx;
  const Batches d;
  CriticModel<P> joint(ctx, {.max_batch = N, .seed = 3, .forwards_per_iteration = 2});
  auto real = nn::bce_with_logits(ctx, joint.forward(ctx, d.x(d.real)), d.y(d.ones));
  auto fake = nn::bce_with_logits(ctx, joint.forward(ctx, d.x(d.fake)), d.y(d.zeros));
  CHECK(joint.graph().forwards() == 2);
  joint.parameters().zero_grad();
  (real + fake).backward();

  const Params p = consumed_values(joint.parameters());
  const auto f = [&](const Params& q) {
    return bce(ref_critic(q, to_double(d.real)), to_double(d.ones)) + bce(ref_critic(q, to_double(d.fake)), to_double(d.zeros));
  };
  CHECK(real.item() + fake.item() == doctest::Approx(f(p)).epsilon(gradient_tolerance<P>()));
  const Params got = gradients(joint.parameters());
  check_against_differences(got, p, f, gradient_tolerance<P>());

  // The same two batches as two iterations whose gradients accumulate.
  CriticModel<P> apart(ctx, {.max_batch = N, .seed = 3});
  apart.parameters().zero_grad();
  for (const auto* batch : {&d.real, &d.fake}) {
    auto loss = nn::bce_with_logits(ctx, apart.forward(ctx, d.x(*batch)), d.y(batch == &d.real ? d.ones : d.zeros));
    loss.backward();
  }
  const Params sum = gradients(apart.parameters());
  for (const auto& [name, g] : got) {
    CAPTURE(name);
    const Vec& h = sum.at(name);
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < g.size(); ++i) scale = std::max(scale, std::abs(h[i])), worst = std::max(worst, std::abs(g[i] - h[i]));
    CHECK(worst <= 1e-6 + 2 * unit_roundoff<typename P::grad_type> * scale);  // the two sums round in another order
  }
  // BatchNorm updated its running statistics once per forward, as in two iterations.
  CHECK(running_means<P>(joint) == running_means<P>(apart));
}

TEST_CASE_TEMPLATE("a siamese pair: one op on the outputs of two forwards back-propagates into both", P, O0Policy,
                   O2Policy, O3Policy, O2BF16Policy) {
  Context<host> ctx;
  const Batches d;
  CriticModel<P> model(ctx, {.max_batch = N, .seed = 4, .forwards_per_iteration = 2});
  auto a = model.forward(ctx, d.x(d.real));
  auto b = model.forward(ctx, d.x(d.fake));
  const std::vector<float> target = exact_inputs(N * 2, 33);
  nn::Output<P, host> both(nn::add(model.graph(), a.var, b.var), &model.graph());
  auto loss = nn::mse_loss(ctx, both, d.y(target));
  model.parameters().zero_grad();
  loss.backward();
  const Params p = consumed_values(model.parameters());
  const auto f = [&](const Params& q) {
    return mse(add(ref_critic(q, to_double(d.real)), ref_critic(q, to_double(d.fake))), to_double(target));
  };
  CHECK(loss.item() == doctest::Approx(f(p)).epsilon(gradient_tolerance<P>()));
  check_against_differences(gradients(model.parameters()), p, f, gradient_tolerance<P>());
}

TEST_CASE_TEMPLATE("stale handles are errors naming the handle and both iterations; a kept loss is exact", P, O0Policy,
                   O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  Context<host> ctx;
  const Batches d;
  CriticModel<P> model(ctx, {.max_batch = N, .seed = 5, .forwards_per_iteration = 2});

  // A loss kept from the first forward, back-propagated after a second forward of
  // the same model: its own gradients, bit for bit, as if the second never ran.
  CriticModel<P> alone(ctx, {.max_batch = N, .seed = 5});
  auto kept = nn::bce_with_logits(ctx, model.forward(ctx, d.x(d.real)), d.y(d.ones));
  auto later = model.forward(ctx, d.x(d.fake));
  auto reference = nn::bce_with_logits(ctx, alone.forward(ctx, d.x(d.real)), d.y(d.ones));
  model.parameters().zero_grad();
  alone.parameters().zero_grad();
  kept.backward();
  reference.backward();
  CHECK(gradients(model.parameters()) == gradients(alone.parameters()));
  CHECK(kept.item() == reference.item());

  // Backward ran: the next forward starts iteration 2; what came from iteration 1 is refused.
  const std::uint64_t first = model.graph().iteration();
  auto fresh = model.forward(ctx, d.x(d.fake));
  CHECK(model.graph().iteration() == first + 1);
  const std::string from = "is from iteration " + std::to_string(first) + " of its graph, which is now at iteration " +
                           std::to_string(first + 1);
  CHECK_THROWS_WITH_AS(kept.backward(), doctest::Contains(("bce_with_logits.backward() (a Loss): tensor [4x2] " + from).c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(kept.item(), doctest::Contains(("bce_with_logits.item() (a Loss): tensor [4x2] " + from).c_str()), Error);
  CHECK_THROWS_WITH_AS(later.value(), doctest::Contains(("Output::value(): tensor [4x2] " + from).c_str()), Error);
  CHECK_THROWS_WITH_AS(nn::mse_loss(ctx, later, d.y(d.ones)), doctest::Contains(("mse_loss: tensor [4x2] " + from).c_str()), Error);
  CHECK_THROWS_WITH_AS(nn::relu(model.graph(), later.var), doctest::Contains(("activation: tensor [4x2] " + from).c_str()), Error);
  CHECK_THROWS_WITH_AS(model.net().l2(model.graph(), later.var), doctest::Contains("Linear 'l2.'"), Error);

  // Twice on one iteration, and a loss of an iteration already back-propagated.
  auto loss = nn::bce_with_logits(ctx, fresh, d.y(d.zeros));
  loss.backward();
  CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("backward() already ran on that iteration"), Error);
  CHECK_THROWS_WITH_AS((loss + loss).backward(), doctest::Contains("backward() already ran"), Error);
  CHECK(std::isfinite(loss.item()));  // its values stay readable until the next forward
}

TEST_CASE("an evaluation forward inside a training iteration leaves the pending tape intact, or is an error when used") {
  using P = O2Policy;
  Context<host> ctx;
  const Batches d;
  CriticModel<P> model(ctx, {.max_batch = N, .seed = 6, .forwards_per_iteration = 2});
  CriticModel<P> plain(ctx, {.max_batch = N, .seed = 6});
  auto loss = nn::bce_with_logits(ctx, model.forward(ctx, d.x(d.real)), d.y(d.ones));
  model.eval();
  auto validation = model.forward(ctx, d.x(d.fake));  // joins the iteration: the training tape stays
  const auto seen = download(ctx, validation.value().span());
  model.train();
  model.parameters().zero_grad();
  loss.backward();
  auto reference = nn::bce_with_logits(ctx, plain.forward(ctx, d.x(d.real)), d.y(d.ones));
  plain.parameters().zero_grad();
  reference.backward();
  CHECK(gradients(model.parameters()) == gradients(plain.parameters()));
  CHECK(seen.size() == N * 2);

  // Planned for one forward: a second forward, evaluation or training, abandons
  // the pending iteration, and its loss says why when it is used.
  auto pending = nn::bce_with_logits(ctx, plain.forward(ctx, d.x(d.real)), d.y(d.ones));
  plain.eval();
  auto next = plain.forward(ctx, d.x(d.fake));
  CHECK_THROWS_WITH_AS(pending.backward(), doctest::Contains("past ModelOptions::forwards_per_iteration"), Error);
  CHECK(next.value().rows == N);

  // Evaluation alone: each forward starts an iteration (an evaluation loop never fills the arena).
  for (int i = 0; i < 5; ++i) CHECK(std::isfinite(cast<float>(download(ctx, plain.forward(ctx, d.x(d.fake)).value().span())[0])));
}

TEST_CASE("several forwards per iteration: planned once, then no allocation") {
  Context<host> ctx;
  const Batches d;
  CriticModel<O2Policy> one(ctx, {.max_batch = N, .seed = 7});
  CriticModel<O2Policy> two(ctx, {.max_batch = N, .seed = 7, .forwards_per_iteration = 2});
  CHECK(two.graph().arena_bytes() > one.graph().arena_bytes());
  CHECK(two.graph().arena_bytes() <= 2 * one.graph().arena_bytes());
  optim::Adam<O2Policy, host> opt(two.parameters(), {.lr = 0.01f});
  const auto step = [&] {
    auto real = nn::bce_with_logits(ctx, two.forward(ctx, d.x(d.real)), d.y(d.ones));
    auto fake = nn::bce_with_logits(ctx, two.forward(ctx, d.x(d.fake)), d.y(d.zeros));
    auto both = real + fake;
    opt.zero_grad();
    {
      auto scaled = scale_loss(both, opt);
      scaled.backward();
    }
    opt.step();
  };
  step();
  const std::size_t allocations = ctx.memory().allocations();
  for (int i = 0; i < 5; ++i) step();
  CHECK(ctx.memory().allocations() == allocations);
  CHECK_THROWS_WITH_AS((CriticModel<O2Policy>(ctx, {.max_batch = N, .forwards_per_iteration = 0})),
                       doctest::Contains("forwards_per_iteration must be in [1, 64], got 0"), Error);
}
