#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "amp/amp.hpp"
#include "support/param_fixture.hpp"

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
  static_assert(default_scaler_config<O0Policy>().mode == scaling::none);
  static_assert(default_scaler_config<O1Policy>().mode == scaling::dynamic);
  static_assert(default_scaler_config<O2Policy>().init_scale == 65536.0f);
  static_assert(default_scaler_config<O3Policy>().mode == scaling::static_scale);
  static_assert(default_scaler_config<O3Policy>().init_scale == 1.0f);
  static_assert(default_scaler_config<O2BF16Policy>().mode == scaling::none);
  constexpr ScalerConfig d{};
  static_assert(d.growth_factor == 2.0f && d.backoff_factor == 0.5f && d.growth_interval == 2000 &&
                d.max_scale == 16777216.0f);
  Context<host> ctx;
  CHECK(StaticLossScaler<host>(ctx, 128.0f).stats().scale == 128.0f);
  CHECK(NoLossScaler<host>(ctx).stats().scale == 1.0f);
  CHECK(DynamicLossScaler<host>(ctx).stats().scale == 65536.0f);
  CHECK_THROWS_WITH_AS((DynamicLossScaler<host>(ctx, {.init_scale = 0.0f})), doctest::Contains("0 < min_scale <= init_scale"),
                       Error);
  CHECK_THROWS_WITH_AS((DynamicLossScaler<host>(ctx, {.backoff_factor = 1.5f})), doctest::Contains("backoff_factor"), Error);
}

TEST_CASE("kInf and NaN gradients: the step is skipped bit for bit and the scale backs off") {
  for (const float bad : {kInf, -kInf, kNaN}) {
    CAPTURE(bad);
    Context<host> ctx;
    ParamFixture<O2Policy, host> f(ctx, {0.5f, -0.25f, 1.0f});
    optim::Adam<O2Policy, host> opt(*f.params, {.lr = 0.1f});
    f.set_grads({1000.0f, 2000.0f, -3000.0f});
    opt.step();  // one good step, so there is optimizer state to preserve
    const auto master = f.values();
    const auto weights = bits_of(f.weights());
    const auto m = download(ctx, opt.state_buffer(0));
    const auto v = download(ctx, opt.state_buffer(1));
    CHECK(opt.scaler().stats().scale == 65536.0f);

    f.set_grads({1000.0f, bad, 5.0f});
    opt.step();
    CHECK(f.values() == master);
    CHECK(bits_of(f.weights()) == weights);
    CHECK(download(ctx, opt.state_buffer(0)) == m);
    CHECK(download(ctx, opt.state_buffer(1)) == v);
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
  f.set_grads({1.0f});
  for (int i = 0; i < 1999; ++i) opt.step();
  CHECK(opt.scaler().stats().scale == 65536.0f);
  opt.step();
  CHECK(opt.scaler().stats().scale == 131072.0f);

  ParamFixture<O1Policy, host> g(ctx, {0.0f});
  optim::SGD<O1Policy, host> capped(*g.params, {.lr = 0.0f}, {.init_scale = 4194304.0f, .growth_interval = 1});
  g.set_grads({1.0f});
  capped.step();
  CHECK(capped.scaler().stats().scale == 8388608.0f);
  capped.step();
  CHECK(capped.scaler().stats().scale == 16777216.0f);
  capped.step();
  CHECK(capped.scaler().stats().scale == 16777216.0f);  // 2^24 is the default max
  // An overflow resets the growth window.
  g.set_grads({kInf});
  capped.step();
  CHECK(capped.scaler().stats().scale == 8388608.0f);
}

TEST_CASE("the scale backs off to its floor and never below; a run stuck there is a divergence") {
  Context<host> ctx;
  ParamFixture<O1Policy, host> f(ctx, {0.0f});
  optim::SGD<O1Policy, host> opt(*f.params, {.lr = 0.1f},
                                 {.init_scale = 8.0f, .min_scale = 2.0f, .max_consecutive_skips = 5});
  f.set_grads({kNaN});
  const std::vector<float> expect{4.0f, 2.0f, 2.0f, 2.0f};
  for (const float e : expect) {
    opt.step();
    CHECK(opt.scaler().stats().scale == e);
  }
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("training diverged: 5 consecutive steps had non-finite gradients (loss scale 2, at its floor)"),
                       Error);
  CHECK(f.values()[0] == 0.0f);  // nothing was lost
}

TEST_CASE("a NaN loss is reported as a divergence, not skipped forever") {
  Context<host> ctx;
  nn::Sequential<O2Policy, host, nn::Linear> model(ctx, {.max_batch = 2, .seed = 1}, {.in_features = 2, .out_features = 1});
  optim::SGD<O2Policy, host> opt(model.parameters(), {.lr = 0.1f});
  std::vector<float> x{1, 2, 3, 4}, y{0, kNaN};
  const auto before = download(ctx, Span<const float>(model.parameters().master()));
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
  CHECK(download(ctx, Span<const float>(model.parameters().master())) == before);
  auto loss = nn::mse_loss(ctx, model.forward(ctx, matrix<const float>(x.data(), 2, 2)), matrix<const float>(y.data(), 2, 1));
  CHECK_THROWS_WITH_AS(loss.item(), doctest::Contains("mse_loss: the target of row 1 is invalid"), Error);
}

TEST_CASE("the overflow check yields non-finite count, sum of squares and max |g| in one reduction") {
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
  CHECK(overflowed(GradStats{kInf, 1.0f, 0}));  // a norm beyond fp32 is an overflow too
}
