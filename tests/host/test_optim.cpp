#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "amp/amp.hpp"
#include "support/param_fixture.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
const std::vector<float> w0{0.5f, -1.25f, 2.0f, 0.125f};
const std::vector<std::vector<float>> grads{{0.1f, -0.2f, 0.3f, 0.0f}, {-0.4f, 0.5f, 0.05f, 1.0f}, {0.2f, 0.2f, -0.6f, -0.3f}};
}  // namespace

TEST_CASE("SGD matches the closed-form steps (momentum, dampening, nesterov, weight decay)") {
  struct Case { float momentum, dampening, wd; bool nesterov; };
  for (const Case c : {Case{0, 0, 0, false}, Case{0.9f, 0.1f, 0.01f, false}, Case{0.9f, 0, 0.05f, true}}) {
    CAPTURE(c.momentum);
    CAPTURE(c.nesterov);
    Context<host> ctx;
    ParamFixture<O0Policy, host> f(ctx, w0);
    optim::SGD<O0Policy, host> opt(*f.params, {.lr = 0.1f, .momentum = c.momentum, .dampening = c.dampening,
                                               .nesterov = c.nesterov, .weight_decay = c.wd});
    std::vector<double> w(w0.begin(), w0.end()), buf(w0.size());
    for (std::size_t t = 0; t < grads.size(); ++t) {
      f.set_grads(grads[t]);
      opt.step();
      for (std::size_t i = 0; i < w.size(); ++i) {
        double g = grads[t][i] + c.wd * w[i];
        if (c.momentum != 0) {
          buf[i] = t == 0 ? g : c.momentum * buf[i] + (1 - c.dampening) * g;
          g = c.nesterov ? g + c.momentum * buf[i] : buf[i];
        }
        w[i] -= 0.1 * g;
      }
      const auto got = f.values();
      for (std::size_t i = 0; i < w.size(); ++i) CHECK(got[i] == doctest::Approx(w[i]).epsilon(1e-6));
    }
    CHECK(opt.applied_steps() == 3);
  }
}

TEST_CASE("Adam and AdamW match the closed-form steps") {
  for (const bool decoupled : {false, true}) {
    CAPTURE(decoupled);
    Context<host> ctx;
    ParamFixture<O0Policy, host> f(ctx, w0);
    const optim::AdamOptions o{.lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.1f};
    std::unique_ptr<optim::Adam<O0Policy, host>> adam;
    std::unique_ptr<optim::AdamW<O0Policy, host>> adamw;
    if (decoupled) adamw = std::make_unique<optim::AdamW<O0Policy, host>>(*f.params, o);
    else adam = std::make_unique<optim::Adam<O0Policy, host>>(*f.params, o);
    std::vector<double> w(w0.begin(), w0.end()), m(w0.size()), v(w0.size());
    for (std::size_t t = 0; t < grads.size(); ++t) {
      f.set_grads(grads[t]);
      if (decoupled) adamw->step();
      else adam->step();
      const double bc1 = 1 - std::pow(0.8, t + 1), bc2 = 1 - std::pow(0.95, t + 1);
      for (std::size_t i = 0; i < w.size(); ++i) {
        double g = grads[t][i];
        if (decoupled) w[i] -= 0.01 * 0.1 * w[i];
        else g += 0.1 * w[i];
        m[i] = 0.8 * m[i] + 0.2 * g;
        v[i] = 0.95 * v[i] + 0.05 * g * g;
        w[i] -= 0.01 * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + 1e-6);
      }
      const auto got = f.values();
      for (std::size_t i = 0; i < w.size(); ++i) CHECK(got[i] == doctest::Approx(w[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("O2: the fp16 weights equal the rounded fp32 master after every step, and grads are unscaled") {
  Context<host> ctx;
  ParamFixture<O2Policy, host> f(ctx, w0);
  optim::SGD<O2Policy, host> opt(*f.params, {.lr = 0.1f, .momentum = 0.9f});
  std::vector<double> w(w0.begin(), w0.end()), buf(w0.size());
  const float scale = opt.scaler().stats().scale;
  CHECK(scale == 65536.0f);
  for (std::size_t t = 0; t < grads.size(); ++t) {
    std::vector<float> scaled(grads[t]);
    for (auto& g : scaled) g *= 0.5f * scale;  // what a scaled backward leaves (|g| * scale < 65504)
    f.set_grads(scaled);
    opt.step();
    const auto master = f.values();
    const auto half_w = f.weights();
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double g = static_cast<double>(cast<float>(cast<half>(scaled[i]))) / scale;
      buf[i] = t == 0 ? g : 0.9 * buf[i] + g;
      w[i] -= 0.1 * buf[i];
      CHECK(master[i] == doctest::Approx(w[i]).epsilon(1e-5));
      CHECK(detail::bits(half_w[i]) == detail::bits(cast<half>(master[i])));
    }
  }
}

TEST_CASE("gradient clipping by global norm is fused into the step") {
  Context<host> ctx;
  ParamFixture<O1Policy, host> f(ctx, {1.0f, 1.0f});
  optim::SGD<O1Policy, host> opt(*f.params, {.lr = 1.0f}, {.max_grad_norm = 1.0f});
  f.set_grads({3.0f * 65536, 4.0f * 65536});  // fp32 grads under O1; norm 5 once unscaled
  opt.step();
  const auto w = f.values();
  CHECK(w[0] == doctest::Approx(1.0 - 3.0 / 5.0).epsilon(1e-5));
  CHECK(w[1] == doctest::Approx(1.0 - 4.0 / 5.0).epsilon(1e-5));
  const auto stats = opt.last_stats();  // as the gradients were: scaled
  CHECK(std::sqrt(stats.sumsq) / 65536 == doctest::Approx(5.0));
  CHECK(stats.maxabs / 65536 == doctest::Approx(4.0));
}

TEST_CASE("learning-rate schedules") {
  const optim::StepLR step{1.0f, 10, 0.5f};
  CHECK(step(0) == 1.0f);
  CHECK(step(9) == 1.0f);
  CHECK(step(10) == 0.5f);
  CHECK(step(25) == 0.25f);
  const optim::CosineLR cosine{1.0f, 100, 0.1f};
  CHECK(cosine(0) == doctest::Approx(1.0));
  CHECK(cosine(50) == doctest::Approx(0.55));
  CHECK(cosine(100) == doctest::Approx(0.1));
  CHECK(cosine(1000) == doctest::Approx(0.1));
  const optim::LinearWarmup<optim::CosineLR> warm{10, cosine};
  CHECK(warm(0) == doctest::Approx(0.1));
  CHECK(warm(9) == doctest::Approx(1.0));
  CHECK(warm(60) == doctest::Approx(0.55));

  Context<host> ctx;
  ParamFixture<O0Policy, host> f(ctx, {0.0f});
  optim::SGD<O0Policy, host> opt(*f.params, {.lr = 1.0f});
  opt.set_schedule(step);
  std::vector<double> expect{0.0};
  for (int t = 0; t < 12; ++t) {
    f.set_grads({1.0f});
    opt.step();
    expect[0] -= step(t);
  }
  CHECK(f.values()[0] == doctest::Approx(expect[0]));
  CHECK(opt.lr() == 0.5f);
}

TEST_CASE("a schedule of your own is tabulated once: the function's rates, the last one after the table") {
  Context<host> ctx;
  ParamFixture<O0Policy, host> f(ctx, {0.0f});
  optim::SGD<O0Policy, host> opt(*f.params, {.lr = 1.0f});
  const auto rate = [](std::int64_t t) { return 1.0f / static_cast<float>((t + 1) * (t + 1)); };  // no named form
  opt.set_schedule(rate, 5);
  double expect = 0.0;
  for (int t = 0; t < 8; ++t) {
    CHECK(opt.lr() == rate(std::min(t, 4)));
    f.set_grads({1.0f});
    opt.step();
    expect -= rate(std::min(t, 4));
  }
  CHECK(f.values()[0] == doctest::Approx(expect).epsilon(1e-6));
  CHECK_THROWS_WITH_AS(opt.set_schedule([](std::int64_t t) { return t == 2 ? -1.0f : 0.1f; }, 4),
                       doctest::Contains("the rate of step 2 is -1"), Error);
  CHECK_THROWS_WITH_AS(opt.set_schedule(rate, 0), doctest::Contains("steps > 0"), Error);
  // Bad rates and schedules are refused and change nothing: the table still rules.
  CHECK_THROWS_WITH_AS(opt.set_lr(std::nanf("")), doctest::Contains("the rate must be finite and >= 0"), Error);
  optim::Schedule bad;
  bad.k = optim::Schedule::kind::step, bad.base_lr = 1.0f, bad.step_size = 0;
  CHECK_THROWS_WITH_AS(opt.set_schedule(bad), doctest::Contains("need step_size > 0"), Error);
  const float elsewhere[2] = {1.0f, 2.0f};
  optim::Schedule foreign;
  foreign.k = optim::Schedule::kind::table, foreign.table = elsewhere, foreign.table_size = 2;
  CHECK_THROWS_WITH_AS(opt.set_schedule(foreign), doctest::Contains("comes from set_schedule(function, steps)"),
                       Error);
  CHECK(opt.lr() == rate(4));
}

TEST_CASE("optimizer options are validated") {
  Context<host> ctx;
  ParamFixture<O0Policy, host> f(ctx, {0.0f});
  CHECK_THROWS_WITH_AS((optim::SGD<O0Policy, host>(*f.params, {.lr = -1.0f})), doctest::Contains("learning rate"), Error);
  CHECK_THROWS_WITH_AS((optim::SGD<O0Policy, host>(*f.params, {.lr = 0.1f, .nesterov = true})),
                       doctest::Contains("nesterov needs momentum"), Error);
  CHECK_THROWS_WITH_AS((optim::Adam<O0Policy, host>(*f.params, {.beta1 = 1.0f})), doctest::Contains("betas"), Error);
  CHECK_THROWS_WITH_AS((optim::SGD<O0Policy, host>(*f.params, {}, {.accumulation_steps = 0})),
                       doctest::Contains("accumulation_steps"), Error);
}

TEST_CASE("parameter groups: their own learning rate and weight decay, in the same fused pass") {
  Context<host> ctx;
  nn::ParameterStore<O0Policy, host> store(ctx);
  const auto w = store.declare<nn::role::weight>("layer.weight", {2}, nn::Init::constant(1.0f));
  const auto b = store.declare<nn::role::weight>("layer.bias", {2}, nn::Init::constant(1.0f), false);
  const auto g = store.declare<nn::role::norm>("norm.weight", {2}, nn::Init::constant(1.0f), false);
  store.allocate();
  store.initialize(0);
  optim::SGD<O0Policy, host> opt(store, {.lr = 0.1f, .weight_decay = 0.5f},
                                 {.groups = {{.select = optim::select::no_decay, .lr = 0.01f, .weight_decay = 0.0f}}});
  opt.set_schedule(optim::StepLR{0.1f, 1, 0.5f});  // 0.1, then 0.05; groups keep their ratio
  for (int t = 0; t < 2; ++t) {
    upload(ctx, store.grads(w), std::vector<float>{1, 1});
    upload(ctx, store.grads(b), std::vector<float>{1, 1});
    upload(ctx, store.grads(g), std::vector<float>{1, 1});
    opt.step();
  }
  // decayed group: w -= lr (g + 0.5 w); the no-decay group: lr / 10, no decay.
  const double w1 = 1 - 0.1 * (1 + 0.5), w2 = w1 - 0.05 * (1 + 0.5 * w1);
  CHECK(store.get_values(w.index)[0] == doctest::Approx(w2));
  const double b2 = 1 - 0.01 - 0.005;
  CHECK(store.get_values(b.index)[1] == doctest::Approx(b2));
  CHECK(store.get_values(g.index)[0] == doctest::Approx(b2));
}

TEST_CASE("O2: one step covers fp16 weights with fp32 masters and fp32 norm parameters without") {
  Context<host> ctx;
  nn::ParameterStore<O2Policy, host> store(ctx);
  const auto w = store.declare<nn::role::weight>("w", {3}, nn::Init::constant(0.3f));
  const auto n = store.declare<nn::role::norm>("n", {3}, nn::Init::constant(0.3f));
  store.allocate();
  store.initialize(0);
  static_assert(nn::RoleArena<O2Policy, host, nn::role::weight>::has_master);
  static_assert(!nn::RoleArena<O2Policy, host, nn::role::norm>::has_master);
  static_assert(std::is_same_v<decltype(store.values(n))::value_type, float>);
  CHECK(ctx.memory().current(memory_kind::master) > 0);
  optim::SGD<O2Policy, host> opt(store, {.lr = 0.25f});
  upload(ctx, store.grads(w), std::vector<half>(3, cast<half>(32768.0f)));  // 0.5 at the initial scale
  upload(ctx, store.grads(n), std::vector<float>(3, 32768.0f));
  opt.step();
  CHECK(store.get_values(w.index)[0] == doctest::Approx(0.3f - 0.125f).epsilon(1e-6));
  CHECK(store.get_values(n.index)[2] == doctest::Approx(0.3f - 0.125f).epsilon(1e-6));
}

TEST_CASE("several models in one optimizer") {
  Context<host> ctx;
  ParamFixture<O0Policy, host> a(ctx, {1.0f}), b(ctx, {2.0f, 3.0f});
  optim::SGD<O0Policy, host> opt({a.params.get(), b.params.get()}, {.lr = 0.5f});
  a.set_grads({1.0f});
  b.set_grads({2.0f, -2.0f});
  opt.step();
  CHECK(a.values() == std::vector<float>{0.5f});
  CHECK(b.values() == std::vector<float>{1.0f, 4.0f});
}
