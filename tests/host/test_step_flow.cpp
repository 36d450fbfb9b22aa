// The step flows one way: a scaler's check produces a record, the update
// consumes it. Misuse the step could not see before is an error that loses
// nothing: a step with no new backward, a backward without the loss scale at
// a level that scales.
#include <doctest/doctest.h>

#include <vector>

#include "amp/amp.hpp"
#include "support/param_fixture.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
template <Policy P>
using Net = nn::Sequential<P, host, nn::Linear, nn::ReLU, nn::Linear>;

template <Policy P>
Net<P> make_net(Context<host>& ctx) {
  return Net<P>(ctx, {.max_batch = 8, .seed = 3}, {.in_features = 4, .out_features = 8}, {},
                {.in_features = 8, .out_features = 3});
}

struct Batch {
  std::vector<float> x = random_values<float>(32, 7);
  std::vector<std::int32_t> labels = {0, 1, 2, 0, 1, 2, 0, 1};
  auto input() const { return matrix<const float>(x.data(), 8, 4); }
  Span<const std::int32_t> targets() const { return {labels.data(), labels.size()}; }
};

// One forward of the batch and its loss.
template <class N>
auto loss_of(Context<host>& ctx, N& net, const Batch& b) {
  return nn::cross_entropy(ctx, net.forward(ctx, b.input()), b.targets());
}
// The three lines' first two: zero_grad and the scaled backward (the step is the test's).
template <class N, class O>
void scaled_backward(Context<host>& ctx, N& net, O& opt, const Batch& b) {
  auto loss = loss_of(ctx, net, b);
  opt.zero_grad();
  scale_loss(loss, opt).backward();
}

template <Policy P>
std::vector<float> weights(Net<P>& net) {
  std::vector<float> all;
  for (std::size_t i = 0; i < net.parameters().table().size(); ++i) {
    const auto v = net.parameters().get_values(static_cast<int>(i));
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}
}  // namespace

TEST_CASE_TEMPLATE("a second step() with no backward since the last is an error that changes nothing", P, O0Policy,
                   O2Policy) {
  Context<host> ctx;
  const Batch b;
  auto net = make_net<P>(ctx);
  optim::SGD<P, host> opt(net.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  scaled_backward(ctx, net, opt, b);
  opt.step();
  const std::vector<float> after_one = weights(net);
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("no backward since this optimizer's last step()"), Error);
  CHECK(opt.applied_steps() == 1);
  CHECK(weights(net) == after_one);

  SUBCASE("and after zero_grad() too") {
    opt.zero_grad();
    CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("no backward"), Error);
    CHECK(opt.applied_steps() == 1);
  }
  SUBCASE("the next iteration steps as usual") {
    scaled_backward(ctx, net, opt, b);
    opt.step();
    CHECK(opt.applied_steps() == 2);
    CHECK(weights(net) != after_one);
  }
}

TEST_CASE("at O2, loss.backward() then step() is an error: the step would divide unscaled gradients by the scale") {
  Context<host> ctx;
  const Batch b;
  auto net = make_net<O2Policy>(ctx);
  optim::SGD<O2Policy, host> opt(net.parameters(), {.lr = 0.1f});
  const std::vector<float> before = weights(net);
  auto loss = loss_of(ctx, net, b);
  opt.zero_grad();
  loss.backward();
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("ran without the loss scale"), Error);
  CHECK(opt.applied_steps() == 0);
  CHECK(opt.scaler().stats().steps == 0);  // the scaler's state is untouched
  CHECK(weights(net) == before);

  SUBCASE("scaler.step(opt) refuses it too") {
    CHECK_THROWS_WITH_AS(opt.scaler().step(opt), doctest::Contains("ran without the loss scale"), Error);
    CHECK(weights(net) == before);
  }
  SUBCASE("the next iteration, scaled, steps") {
    scaled_backward(ctx, net, opt, b);
    opt.step();
    CHECK(opt.applied_steps() == 1);
  }
}

TEST_CASE("at levels without loss scaling, loss.backward() then step() is the right three lines") {
  Context<host> ctx;
  const Batch b;
  auto net = make_net<O1BF16Policy>(ctx);
  optim::SGD<O1BF16Policy, host> opt(net.parameters(), {.lr = 0.1f});
  auto loss = loss_of(ctx, net, b);
  opt.zero_grad();
  loss.backward();
  opt.step();
  CHECK(opt.applied_steps() == 1);
}

TEST_CASE("with accumulation, each micro-batch's step() needs its own backward") {
  Context<host> ctx;
  const Batch b;
  auto net = make_net<O0Policy>(ctx);
  optim::SGD<O0Policy, host> opt(net.parameters(), {.lr = 0.1f}, {.accumulation_steps = 2});
  scaled_backward(ctx, net, opt, b);
  opt.step();  // the first micro-batch: accumulates
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("no backward"), Error);
  CHECK(opt.applied_steps() == 0);
  auto second = loss_of(ctx, net, b);
  scale_loss(second, opt).backward();
  opt.step();
  CHECK(opt.applied_steps() == 1);
}

TEST_CASE("gradients written by hand count as new gradients") {
  Context<host> ctx;
  ParamFixture<O0Policy, host> f(ctx, {1.0f});
  optim::SGD<O0Policy, host> opt(*f.params, {.lr = 0.5f});
  f.set_grads({1.0f});
  opt.step();
  CHECK(f.values() == std::vector<float>{0.5f});
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("no backward"), Error);
  f.set_grads({1.0f});
  opt.step();
  CHECK(f.values() == std::vector<float>{0.0f});
}

TEST_CASE("the three-line step and the explicit scaler.step(opt) are one step, bit for bit") {
  Context<host> ctx;
  const Batch b;
  auto three = make_net<O2Policy>(ctx);
  auto explicit_form = make_net<O2Policy>(ctx);
  optim::Adam<O2Policy, host> opt_three(three.parameters(), {.lr = 0.01f}, {.max_grad_norm = 0.5f});
  optim::Adam<O2Policy, host> opt_explicit(explicit_form.parameters(), {.lr = 0.01f}, {.max_grad_norm = 0.5f});
  auto& scaler = opt_explicit.scaler();
  for (int it = 0; it < 4; ++it) {
    scaled_backward(ctx, three, opt_three, b);
    opt_three.step();

    auto le = loss_of(ctx, explicit_form, b);
    opt_explicit.zero_grad();
    scaler.scale(le).backward();
    scaler.step(opt_explicit);
    scaler.update();
  }
  CHECK(weights(three) == weights(explicit_form));
  CHECK(opt_three.scaler().stats().scale == scaler.stats().scale);
  CHECK(opt_three.applied_steps() == 4);
}

TEST_CASE("the record of a check: the scale to divide by, or the fp32 copy once unscaled") {
  Context<host> ctx;
  ParamFixture<O2Policy, host> f(ctx, {1.0f, 2.0f});
  optim::SGD<O2Policy, host> opt(*f.params, {.lr = 1.0f});
  auto& scaler = opt.scaler();
  f.set_grads({32768.0f, -32768.0f});  // 0.5 at the initial scale, 2^16
  scaled_by_hand(scaler);
  Gradients<O2Policy, host>& g = opt.gradients();
  g.check(nullptr, true);
  const StepRecord scaled = g.record(scaler.scale_ptr());
  CHECK(scaled.scale == scaler.scale_ptr());
  CHECK(scaled.unscaled == nullptr);
  CHECK(scaled.factor == 1.0f);
  CHECK(download_one(ctx, scaled.stats).sumsq == doctest::Approx(2.0 * 32768.0 * 32768.0));
  CHECK(download_one(ctx, scaled.found_inf) == 0);

  g.unscale(scaler.scale_ptr());
  const StepRecord unscaled = g.record(scaler.scale_ptr());
  CHECK(unscaled.scale == nullptr);
  REQUIRE(unscaled.unscaled != nullptr);
  CHECK(unscaled.unscaled[0] == g.unscaled(*f.params, f.w.index).data);
  CHECK(download(ctx, Span<const float>(g.unscaled(*f.params, f.w.index))) == std::vector<float>{0.5f, -0.5f});
}

TEST_CASE("a captured forward and backward, stepped eagerly after each replay: the replays' gradients count as new") {
  Context<host> ctx;
  const Batch b;
  auto captured = make_net<O2Policy>(ctx);
  auto eager = make_net<O2Policy>(ctx);
  optim::SGD<O2Policy, host> opt(captured.parameters(), {.lr = 0.1f});
  optim::SGD<O2Policy, host> opt_eager(eager.parameters(), {.lr = 0.1f});
  const auto backward = [&](auto& net, auto& o) {
    auto loss = loss_of(ctx, net, b);
    o.zero_grad();
    scale_loss(loss, o).backward();
  };
  CapturedStep graph(ctx, [&] { backward(captured, opt); });  // the warmup's backward, then the recording
  opt.step();                                                 // steps the warmup's gradients
  backward(eager, opt_eager);
  opt_eager.step();
  for (int i = 0; i < 2; ++i) {
    graph.replay();
    opt.step();
    CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("no backward"), Error);  // and only once
    backward(eager, opt_eager);
    opt_eager.step();
  }
  CHECK(opt.applied_steps() == 3);
  CHECK(weights(captured) == weights(eager));
}

TEST_CASE("LAMB's pre-normalisation is its own option: a StepOptions max_grad_norm is refused, naming it") {
  Context<host> ctx;
  ParamFixture<O0Policy, host> f(ctx, {1.0f});
  const auto build = [&] { optim::LAMB<O0Policy, host> opt(*f.params, {}, {.max_grad_norm = 2.0f}); };
  CHECK_THROWS_WITH_AS(build(), doctest::Contains("LambOptions::max_grad_norm"), Error);
}
