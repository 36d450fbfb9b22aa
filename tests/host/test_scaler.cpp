// The loss scaler against its state machine, and the behaviours PyTorch's
// test_grad_scaling_* and Apex's run_amp tests check, written for amp.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "amp/amp.hpp"
#include "support/param_fixture.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& v) {
  std::vector<std::uint16_t> out;
  for (const T x : v) out.push_back(detail::bits(x));
  return out;
}
}  // namespace

TEST_CASE("policies pick their scaler at compile time") {
  static_assert(default_scaler_t<O0Policy, host>::mode == scaling::none);
  static_assert(default_scaler_t<O1Policy, host>::mode == scaling::dynamic);
  static_assert(default_scaler_t<O3Policy, host>::mode == scaling::static_scale);
  static_assert(default_scaler_t<O2BF16Policy, host>::mode == scaling::none);
  static_assert(default_scaler_config<O2Policy>().init_scale == 65536.0f);
  static_assert(default_scaler_config<O3Policy>().init_scale == 1.0f);
  constexpr ScalerConfig d{};
  static_assert(d.growth_factor == 2.0f && d.backoff_factor == 0.5f && d.growth_interval == 2000 &&
                d.max_scale == 16777216.0f && d.hysteresis == 1 && d.consecutive_hysteresis);
  Context<host> ctx;
  CHECK(StaticLossScaler<host>(ctx, {.init_scale = 128.0f}).stats().scale == 128.0f);
  CHECK(NoLossScaler<host>(ctx).stats().scale == 1.0f);
  CHECK(NoLossScaler<host>(ctx).scale_ptr() == nullptr);  // no scaling: nothing to multiply
  CHECK(DynamicLossScaler<host>(ctx).stats().scale == 65536.0f);
  CHECK_THROWS_WITH_AS((DynamicLossScaler<host>(ctx, {.init_scale = 0.0f})), doctest::Contains("0 < min_scale <= init_scale"),
                       Error);
  CHECK_THROWS_WITH_AS((DynamicLossScaler<host>(ctx, {.backoff_factor = 1.5f})), doctest::Contains("backoff_factor"), Error);
  CHECK_THROWS_WITH_AS((DynamicLossScaler<host>(ctx, {.hysteresis = 0})), doctest::Contains("hysteresis >= 1"), Error);
  CHECK_THROWS_WITH_AS((DynamicLossScaler<host>(ctx, {.growth_factor = 0.5f})), doctest::Contains("growth_factor >= 1"), Error);
  CHECK(DynamicLossScaler<host>(ctx, {.growth_factor = 1.0f}).stats().scale == 65536.0f);  // Apex's "never grow"
}

TEST_CASE("inf and NaN gradients: the step is skipped bit for bit and the scale backs off") {
  for (const float bad : {kInf, -kInf, kNaN}) {
    CAPTURE(bad);
    Context<host> ctx;
    ParamFixture<O2Policy, host> f(ctx, {0.5f, -0.25f, 1.0f});
    optim::Adam<O2Policy, host> opt(*f.params, {.lr = 0.1f});
    f.set_grads({1000.0f, 2000.0f, -3000.0f});
    opt.step();  // one good step, so there is optimizer state to preserve
    const auto master = f.values();
    const auto weights = bits_of(f.weights());
    const auto m = download(ctx, Span<const float>(opt.state_buffer<nn::role::weight>(0)));
    const auto v = download(ctx, Span<const float>(opt.state_buffer<nn::role::weight>(1)));
    CHECK(opt.scaler().stats().scale == 65536.0f);

    f.set_grads({1000.0f, bad, 5.0f});
    opt.step();
    CHECK(f.values() == master);
    CHECK(bits_of(f.weights()) == weights);
    CHECK(download(ctx, Span<const float>(opt.state_buffer<nn::role::weight>(0))) == m);
    CHECK(download(ctx, Span<const float>(opt.state_buffer<nn::role::weight>(1))) == v);
    CHECK(opt.applied_steps() == 1);
    const auto s = opt.scaler().stats();
    CHECK(s.scale == 32768.0f);
    CHECK(s.skipped == 1);
    CHECK(s.steps == 2);
    CHECK(s.consecutive_skips == 1);

    f.set_grads({1000.0f, 1.0f, 5.0f});
    opt.step();
    CHECK(f.values() != master);
    CHECK(opt.applied_steps() == 2);
    CHECK(opt.scaler().stats().consecutive_skips == 0);
  }
}

TEST_CASE("the scale grows after exactly growth_interval clean steps and is capped") {
  Context<host> ctx;
  ParamFixture<O1Policy, host> f(ctx, {0.0f});
  optim::SGD<O1Policy, host> opt(*f.params, {.lr = 0.0f});
  const auto clean_step = [&](auto& fixture, auto& o) {  // each step its own (clean) gradients
    fixture.set_grads({1.0f});
    o.step();
  };
  for (int i = 0; i < 1999; ++i) clean_step(f, opt);
  CHECK(opt.scaler().stats().scale == 65536.0f);
  clean_step(f, opt);
  CHECK(opt.scaler().stats().scale == 131072.0f);

  ParamFixture<O1Policy, host> g(ctx, {0.0f});
  optim::SGD<O1Policy, host> capped(*g.params, {.lr = 0.0f},
                                     {.scaler = ScalerConfig{.init_scale = 4194304.0f, .growth_interval = 1}});
  clean_step(g, capped);
  CHECK(capped.scaler().stats().scale == 8388608.0f);
  clean_step(g, capped);
  CHECK(capped.scaler().stats().scale == 16777216.0f);
  clean_step(g, capped);
  CHECK(capped.scaler().stats().scale == 16777216.0f);  // 2^24 is the default max
  g.set_grads({kInf});  // an overflow resets the growth window
  capped.step();
  CHECK(capped.scaler().stats().scale == 8388608.0f);
}

TEST_CASE("hysteresis: N-1 overflows tolerated, then a backoff at each until a clean step (Apex)") {
  Context<host> ctx;
  ParamFixture<O1Policy, host> f(ctx, {0.0f});
  optim::SGD<O1Policy, host> opt(*f.params, {.lr = 0.0f},
                                 {.scaler = ScalerConfig{.init_scale = 1024.0f, .hysteresis = 2}});
  auto step_with = [&](float g) {
    f.set_grads({g});
    opt.step();
    return opt.scaler().stats().scale;
  };
  CHECK(step_with(kInf) == 1024.0f);  // first overflow: skipped, the scale holds
  CHECK(step_with(kInf) == 512.0f);   // second in a row: backoff
  CHECK(step_with(kInf) == 256.0f);   // and at every further one
  CHECK(opt.scaler().state().hysteresis_left == 0);
  CHECK(step_with(1.0f) == 256.0f);   // a clean step refills the tracker
  CHECK(opt.scaler().state().hysteresis_left == 2);
  CHECK(step_with(kInf) == 256.0f);
  CHECK(step_with(kInf) == 128.0f);
  CHECK(opt.scaler().stats().skipped == 5);
}

TEST_CASE("the scale backs off to its floor and never below; a run stuck there is a divergence") {
  Context<host> ctx;
  ParamFixture<O1Policy, host> f(ctx, {0.0f});
  optim::SGD<O1Policy, host> opt(*f.params, {.lr = 0.1f},
                                 {.scaler = ScalerConfig{.init_scale = 8.0f, .min_scale = 2.0f, .max_consecutive_skips = 5}});
  for (const float e : {4.0f, 2.0f, 2.0f, 2.0f}) {
    f.set_grads({kNaN});
    opt.step();
    CHECK(opt.scaler().stats().scale == e);
  }
  f.set_grads({kNaN});
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("training diverged: 5 consecutive steps had non-finite gradients "
                                                     "(loss scale 2, at its floor)"),
                       Error);
  CHECK(f.values()[0] == 0.0f);  // nothing was lost
}

TEST_CASE("a NaN loss is reported as a divergence, not skipped forever") {
  Context<host> ctx;
  nn::Sequential<O2Policy, host, nn::Linear> model(ctx, {.max_batch = 2, .seed = 1}, {.in_features = 2, .out_features = 1});
  optim::SGD<O2Policy, host> opt(model.parameters(), {.lr = 0.1f});
  std::vector<float> x{1, 2, 3, 4}, y{0, kNaN};
  const auto before = model.parameters().get_values(0);
  int steps = 0;
  try {
    for (; steps < 100; ++steps) {
      auto loss = nn::mse_loss(ctx, model.forward(ctx, matrix<const float>(x.data(), 2, 2)), matrix<const float>(y.data(), 2, 1));
      opt.zero_grad();
      {
        auto scaled = scale_loss(loss, opt);
        scaled.backward();
      }
      opt.step();
    }
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("training diverged: 32 consecutive steps") != std::string::npos);
  }
  CHECK(steps == 31);
  CHECK(model.parameters().get_values(0) == before);
  auto loss = nn::mse_loss(ctx, model.forward(ctx, matrix<const float>(x.data(), 2, 2)), matrix<const float>(y.data(), 2, 1));
  CHECK_THROWS_WITH_AS(loss.item(), doctest::Contains("mse_loss: the target of row 1 is invalid"), Error);
}

TEST_CASE("the overflow check: non-finite count, sum of squares and max |g| in one reduction") {
  Context<host> ctx;
  std::vector<half> g(10000);
  double sumsq = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = cast<half>(static_cast<float>(i % 13) - 6.0f);
    const double v = cast<float>(g[i]);
    sumsq += v * v;
  }
  GradStats s{};
  grad_stats(ctx, Span<const half>{g.data(), g.size()}, &s);
  CHECK(s.nonfinite == 0);
  CHECK(s.maxabs == 6.0f);
  CHECK(s.sumsq == doctest::Approx(sumsq));
  g[77] = cast<half>(kInf);
  g[78] = cast<half>(kNaN);
  grad_stats(ctx, Span<const half>{g.data(), g.size()}, &s);
  CHECK(s.nonfinite == 2);
  CHECK(overflowed(s));
  CHECK(overflowed(GradStats{1e39, 1.0f, 0}));  // a norm beyond fp32 is an overflow too
}

TEST_CASE("the gradient norm of 50M elements is right to fp32 rounding (fp64 sums)") {
  Context<host> ctx;
  std::vector<float> g(50'000'000, 4.0f);
  GradStats s{};
  grad_stats(ctx, Span<const float>{g.data(), g.size()}, &s);
  CHECK(std::sqrt(s.sumsq) == doctest::Approx(4.0 * std::sqrt(5e7)).epsilon(1e-7));  // 28284.27; fp32 sums gave 16384
}

TEST_CASE("call order: unscale or step twice, update without a step, backward after the step are errors") {
  Context<host> ctx;
  nn::Sequential<O2Policy, host, nn::Linear> model(ctx, {.max_batch = 2, .seed = 1}, {.in_features = 2, .out_features = 2});
  optim::SGD<O2Policy, host> opt(model.parameters(), {.lr = 0.1f});
  DynamicLossScaler<host> scaler(ctx);
  std::vector<float> x{1, 2, 3, 4};
  std::vector<std::int32_t> y{0, 1};
  auto backward = [&] {
    auto loss = nn::cross_entropy(ctx, model.forward(ctx, matrix<const float>(x.data(), 2, 2)), Span<const std::int32_t>{y.data(), 2});
    auto s = scaler.scale(loss);
    s.backward();
  };
  CHECK_THROWS_WITH_AS(scaler.update(), doctest::Contains("update() without a step() or unscale()"), Error);
  opt.zero_grad();
  backward();
  scaler.unscale(opt);
  CHECK_THROWS_WITH_AS(scaler.unscale(opt), doctest::Contains("unscale() was already called for this optimizer"), Error);
  scaler.step(opt);
  CHECK_THROWS_WITH_AS(scaler.step(opt), doctest::Contains("step() was already called for this optimizer"), Error);
  CHECK_THROWS_WITH_AS(backward(), doctest::Contains("a scaled backward after this iteration's step() or unscale()"), Error);
  scaler.update();
  CHECK_THROWS_WITH_AS(scaler.update(), doctest::Contains("update() without a step()"), Error);
  opt.zero_grad();
  backward();  // a new iteration is fine
  scaler.step(opt);
  scaler.update();
  CHECK(scaler.stats().steps == 2);
}

TEST_CASE("one scaler, several optimizers: an overflow skips only its optimizer, and the scale backs off once") {
  Context<host> ctx;
  ParamFixture<O2Policy, host> a(ctx, {1.0f, 2.0f}), b(ctx, {3.0f});
  optim::SGD<O2Policy, host> opt_a(*a.params, {.lr = 0.5f}), opt_b(*b.params, {.lr = 0.5f});
  DynamicLossScaler<host> scaler(ctx, {.init_scale = 4.0f});
  a.set_grads({4.0f, 8.0f});
  b.set_grads({kInf});
  scaler.step(opt_a);  // a's gradients are finite: it steps (PyTorch's per-optimizer verdict)
  scaler.step(opt_b);  // b's overflowed: skipped
  scaler.update();
  CHECK(a.values() == std::vector<float>{0.5f, 1.0f});
  CHECK(b.values() == std::vector<float>{3.0f});
  CHECK(opt_a.applied_steps() == 1);
  CHECK(opt_b.applied_steps() == 0);
  CHECK(scaler.stats().scale == 2.0f);  // once, for the iteration
  CHECK(scaler.stats().skipped == 1);
  // Clean: each optimizer steps with its own gradients, unscaled by the shared scale.
  a.set_grads({4.0f, 8.0f});
  b.set_grads({2.0f});
  scaler.step(opt_b);
  scaler.step(opt_a);
  scaler.update();
  CHECK(a.values() == std::vector<float>{-0.5f, -1.0f});
  CHECK(b.values() == std::vector<float>{2.5f});
  // Clipping for b uses b's own norm, not a's.
  optim::SGD<O2Policy, host> clip_b(*b.params, {.lr = 1.0f}, {.max_grad_norm = 0.5f});
  a.set_grads({400.0f, 800.0f});
  b.set_grads({4.0f});  // 2.0 once unscaled by 2
  scaler.step(opt_a);
  scaler.step(clip_b);
  scaler.update();
  CHECK(b.values()[0] == doctest::Approx(2.5 - 0.5).epsilon(1e-3));
}

TEST_CASE_TEMPLATE("after unscale the gradients are fp32 to read, clip by hand or overwrite, and the step uses them", P,
                   O0Policy, O1Policy, O2Policy, O3Policy, O2BF16Policy) {
  Context<host> ctx;
  ParamFixture<P, host> f(ctx, {1.0f, 1.0f, 1.0f});
  optim::SGD<P, host> opt(*f.params, {.lr = 1.0f});
  default_scaler_t<P, host> scaler(ctx, {.init_scale = P::loss_scaling == scaling::none ? 1.0f : 1024.0f});
  const float s = scaler.stats().scale;
  f.set_grads({3.0f * s, 4.0f * s, 0.0f});
  CHECK_THROWS_WITH_AS(opt.gradients().unscaled(*f.params, f.w.index), doctest::Contains("call scaler.unscale(opt) first"),
                       Error);
  scaler.unscale(opt);
  Span<float> g = opt.gradients().unscaled(*f.params, f.w.index);
  CHECK(download(ctx, Span<const float>(g)) == std::vector<float>{3.0f, 4.0f, 0.0f});
  CHECK(f.grads() == std::vector<float>{0.0f, 0.0f, 0.0f});  // moved out of the model's arena
  // Clip to norm 1 by hand, and overwrite the last one.
  upload(ctx, g, std::vector<float>{0.6f, 0.8f, -2.0f});
  scaler.step(opt);
  scaler.update();
  const auto v = f.values();
  const double eps = 2 * unit_roundoff<typename P::param_type>;  // O3 and the bf16 level store no master
  CHECK(v[0] == doctest::Approx(0.4f).epsilon(eps));
  CHECK(v[1] == doctest::Approx(0.2f).epsilon(eps));
  CHECK(v[2] == doctest::Approx(3.0f).epsilon(eps));
  CHECK_THROWS_WITH_AS(opt.gradients().unscaled(*f.params, f.w.index), doctest::Contains("not unscaled in this iteration"),
                       Error);
}

TEST_CASE("explicit unscale under O2 keeps small gradients: they go to fp32, not back to fp16") {
  Context<host> ctx;
  ParamFixture<O2Policy, host> f(ctx, {0.0f});
  optim::SGD<O2Policy, host> opt(*f.params, {.lr = 1.0f});
  DynamicLossScaler<host> scaler(ctx);
  const float tiny = 2e-8f;  // below fp16's smallest subnormal (6e-8)
  f.set_grads({tiny * 65536.0f});
  scaler.unscale(opt);
  scaler.step(opt);
  scaler.update();
  CHECK(f.values()[0] == doctest::Approx(-cast<float>(cast<half>(tiny * 65536.0f)) / 65536.0).epsilon(1e-6));
  CHECK(f.values()[0] != 0.0f);
}

TEST_CASE("clipping gives the same step with and without a separate unscale") {
  Context<host> ctx;
  ParamFixture<O1Policy, host> a(ctx, {1.0f, 1.0f}), b(ctx, {1.0f, 1.0f});
  optim::SGD<O1Policy, host> opt_a(*a.params, {.lr = 1.0f}, {.max_grad_norm = 1.0f});
  optim::SGD<O1Policy, host> opt_b(*b.params, {.lr = 1.0f}, {.max_grad_norm = 1.0f});
  DynamicLossScaler<host> scaler(ctx);
  a.set_grads({3.0f * 65536, 4.0f * 65536});
  b.set_grads({3.0f * 65536, 4.0f * 65536});
  opt_a.step();  // fused unscale
  scaler.unscale(opt_b);
  scaler.step(opt_b);
  scaler.update();
  CHECK(a.values()[0] == doctest::Approx(1.0 - 3.0 / 5.0).epsilon(1e-5));
  CHECK(b.values()[0] == doctest::Approx(a.values()[0]).epsilon(1e-6));
  CHECK(b.values()[1] == doctest::Approx(a.values()[1]).epsilon(1e-6));
}

TEST_CASE("several losses with their own scalers on one optimizer (Apex num_losses), in any order") {
  for (const bool s1_first : {false, true}) {
    CAPTURE(s1_first);
    Context<host> ctx;
    ParamFixture<O2Policy, host> f(ctx, {0.0f, 0.0f});
    optim::SGD<O2Policy, host> opt(*f.params, {.lr = 1.0f});
    DynamicLossScaler<host> s0(ctx, {.init_scale = 1024.0f}), s1(ctx, {.init_scale = 8.0f});
    DynamicLossScaler<host>& stepper = s1_first ? s1 : s0;
    DynamicLossScaler<host>& other = s1_first ? s0 : s1;
    f.set_grads({1.0f * 1024, 2.0f * 1024});  // loss 0's gradients, scaled by s0
    s0.unscale(opt);
    f.set_grads({0.5f * 8, 0.25f * 8});  // loss 1's, scaled by s1
    s1.unscale(opt);
    stepper.step(opt);
    stepper.update();
    other.update();
    CHECK(f.values() == std::vector<float>{-1.5f, -2.25f});
    // An overflow in one loss skips the step and backs off only its scaler.
    f.set_grads({1.0f, 1.0f});
    s0.unscale(opt);
    f.set_grads({kInf, 1.0f});
    s1.unscale(opt);
    stepper.step(opt);
    other.update();
    stepper.update();
    CHECK(f.values() == std::vector<float>{-1.5f, -2.25f});
    CHECK(s0.stats().scale == 1024.0f);
    CHECK(s1.stats().scale == 4.0f);
    // A second scaler that only steps: its share joins the first one's in fp32.
    f.set_grads({1024.0f, 0.0f});
    s0.unscale(opt);
    f.set_grads({0.0f, 4.0f});
    s1.step(opt);
    s0.update();
    s1.update();
    CHECK(f.values() == std::vector<float>{-2.5f, -3.25f});  // s1 backed off to 4
  }
}

TEST_CASE("growth that would pass the largest float keeps the scale, as PyTorch does") {
  Context<host> ctx;
  ParamFixture<O2Policy, host> f(ctx, {0.0f});
  const float big = std::numeric_limits<float>::max() / 1.5f;
  optim::SGD<O2Policy, host> opt(*f.params, {.lr = 0.0f},
                                 {.scaler = ScalerConfig{.init_scale = big, .growth_interval = 1,
                                                         .max_scale = std::numeric_limits<float>::max()}});
  f.set_grads({0.0f});
  opt.step();
  CHECK(opt.scaler().stats().scale == big);
}

TEST_CASE("update(new_scale), new settings, and scaler state that checkpoints restore exactly") {
  Context<host> ctx;
  ParamFixture<O1Policy, host> f(ctx, {0.0f});
  optim::SGD<O1Policy, host> opt(*f.params, {.lr = 0.0f},
                                 {.scaler = ScalerConfig{.init_scale = 64.0f, .growth_interval = 3}});
  const auto clean_step = [&] {  // each step its own (clean) gradients
    f.set_grads({1.0f});
    opt.step();
  };
  clean_step();
  clean_step();
  const ScalerState saved = opt.scaler().state();
  CHECK(saved.growth_tracker == 2);
  opt.scaler().update(512.0f);
  CHECK(opt.scaler().stats().scale == 512.0f);
  opt.scaler().set_state(saved);
  clean_step();  // the third clean step after the restore: growth
  CHECK(opt.scaler().stats().scale == 128.0f);
  opt.scaler().set_config({.init_scale = 64.0f, .growth_interval = 1});
  clean_step();
  CHECK(opt.scaler().stats().scale == 256.0f);
}

TEST_CASE("per-tensor gradient norms from the overflow check's reduction") {
  Context<host> ctx;
  nn::ParameterStore<O0Policy, host> store(ctx);
  const auto a = store.declare<nn::role::weight>("a", {2}, nn::Init::constant(0.0f));
  const auto b = store.declare<nn::role::norm>("b", {3}, nn::Init::constant(0.0f));
  store.allocate();
  optim::SGD<O0Policy, host> opt(store, {.lr = 0.0f}, {.per_tensor_norms = true});
  upload(ctx, store.grads(a), std::vector<float>{3, 4});
  upload(ctx, store.grads(b), std::vector<float>{1, 2, 2});
  opt.step();
  CHECK(opt.per_tensor_norms() == std::vector<float>{5.0f, 3.0f});
  CHECK(std::sqrt(opt.last_stats().sumsq) == doctest::Approx(std::sqrt(34.0)));
}

namespace {
// Two models, two losses, two optimizers, one scaler (a GAN's shape).
template <Policy P>
std::vector<float> train_pair(bool shared) {
  Context<host> ctx;
  using Net = nn::Sequential<P, host, nn::Linear, nn::Linear>;
  Net g(ctx, {.max_batch = 8, .seed = 1}, {.in_features = 4, .out_features = 6, .act = activation::relu},
        {.in_features = 6, .out_features = 3});
  Net d(ctx, {.max_batch = 8, .seed = 2}, {.in_features = 4, .out_features = 6, .act = activation::gelu},
        {.in_features = 6, .out_features = 3});
  optim::Adam<P, host> opt_g(g.parameters(), {.lr = 0.01f}), opt_d(d.parameters(), {.lr = 0.01f});
  default_scaler_t<P, host> scaler(ctx, default_scaler_config<P>());
  const auto x = random_values<float>(8 * 4, 5);
  std::vector<std::int32_t> y{0, 1, 2, 0, 1, 2, 0, 1};
  const Span<const std::int32_t> labels{y.data(), y.size()};
  for (int it = 0; it < 5; ++it) {
    auto lg = nn::cross_entropy(ctx, g.forward(ctx, matrix<const float>(x.data(), 8, 4)), labels);
    auto ld = nn::cross_entropy(ctx, d.forward(ctx, matrix<const float>(x.data(), 8, 4)), labels);
    opt_g.zero_grad();
    opt_d.zero_grad();
    if (shared) {
      {
        auto s = scaler.scale(lg);
        s.backward();
      }
      {
        auto s = scaler.scale(ld);
        s.backward();
      }
      scaler.step(opt_d);
      scaler.step(opt_g);
      scaler.update();
    } else {
      {
        auto s = scale_loss(lg, opt_g);
        s.backward();
      }
      opt_g.step();
      {
        auto s = scale_loss(ld, opt_d);
        s.backward();
      }
      opt_d.step();
    }
  }
  auto out = g.parameters().get_values(0);
  const auto more = d.parameters().get_values(2);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}
}  // namespace

TEST_CASE_TEMPLATE("two models, two losses, two optimizers, one scaler: as if trained apart", P, O0Policy, O1Policy,
                   O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  const auto shared = train_pair<P>(true), apart = train_pair<P>(false);
  REQUIRE(shared.size() == apart.size());
  for (std::size_t i = 0; i < shared.size(); ++i) REQUIRE(shared[i] == apart[i]);  // the same steps, bit for bit
}

TEST_CASE("the GPU mirror's bookkeeping: one copy in flight, kept until its query says it landed") {
  // The query stands in for cudaEventQuery: "not ready" twice, then ready.
  detail::MirrorSlot<int> slot;
  int staged = 0, queries = 0, copies = 0;
  const auto refresh = [&](int value, bool ready) {
    if (slot.take([&] { ++queries; return ready; }, staged)) {
      staged = value;  // the copy that starts now lands in `staged` (on the GPU, later)
      ++copies;
    }
  };
  refresh(1, false);  // nothing in flight: no query, a copy starts
  CHECK(queries == 0);
  CHECK(copies == 1);
  CHECK(slot.latest() == nullptr);
  refresh(2, false);  // in flight, not landed: kept, no second copy
  refresh(3, false);
  CHECK(queries == 2);
  CHECK(copies == 1);
  CHECK(slot.latest() == nullptr);
  refresh(4, true);  // landed: its value is read, and the next copy starts
  REQUIRE(slot.latest() != nullptr);
  CHECK(*slot.latest() == 1);
  CHECK(copies == 2);
  refresh(5, true);
  CHECK(*slot.latest() == 4);
  CHECK(slot.in_flight());
}
