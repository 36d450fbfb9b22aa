#include <doctest/doctest.h>

#include <cmath>

#include "amp/amp.hpp"
#include "support/policies.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
template <Policy P>
using Net = nn::Sequential<P, host, nn::Linear, nn::ReLU, nn::Linear>;

template <Policy P>
Net<P> make_net(Context<host>& ctx, std::int64_t max_batch) {
  return Net<P>(ctx, {.max_batch = max_batch, .seed = 5}, {.in_features = 8, .out_features = 16}, {},
                {.in_features = 16, .out_features = 3});
}

struct Data {
  std::vector<float> x;
  std::vector<std::int32_t> labels;
};
Data make_data(std::int64_t rows) {
  Data d{random_values<float>(static_cast<std::size_t>(rows * 8), 21), std::vector<std::int32_t>(rows)};
  for (std::int64_t r = 0; r < rows; ++r) d.labels[r] = d.x[r * 8] + d.x[r * 8 + 1] > 0 ? 1 : (d.x[r * 8 + 2] > 0 ? 2 : 0);
  return d;
}

// The three-line loop over `micro` micro-batches of `rows` each.
template <Policy P, class Opt>
float train_step(Context<host>& ctx, Net<P>& net, Opt& opt, const Data& d, std::int64_t rows, int micro) {
  float loss_value = 0;
  for (int m = 0; m < micro; ++m) {
    auto y = net.forward(ctx, matrix<const float>(d.x.data() + m * rows * 8, rows, 8));
    auto loss = nn::cross_entropy(ctx, y, Span<const std::int32_t>{d.labels.data() + m * rows, static_cast<std::size_t>(rows)});
    loss_value += loss.item();
    opt.zero_grad();
    {
      auto scaled = scale_loss(loss, opt);
      scaled.backward();
    }
    opt.step();
  }
  return loss_value / static_cast<float>(micro);
}
}  // namespace

TEST_CASE_TEMPLATE("gradient accumulation over micro-batches equals the large batch", P, O0Policy, O2Policy) {
  Context<host> ctx;
  const Data d = make_data(32);
  auto big = make_net<P>(ctx, 32);
  auto small = make_net<P>(ctx, 8);
  // A scale at which the 4x larger accumulated fp16 gradients cannot overflow (they may at 2^16: then a step skips).
  const ScalerConfig scaler{.init_scale = std::is_same_v<P, O2Policy> ? 1024.0f : 1.0f};
  optim::SGD<P, host> opt_big(big.parameters(), {.lr = 0.5f, .momentum = 0.9f}, {.scaler = scaler});
  optim::SGD<P, host> opt_small(small.parameters(), {.lr = 0.5f, .momentum = 0.9f},
                                {.accumulation_steps = 4, .scaler = scaler});
  for (int step = 0; step < 3; ++step) {
    train_step<P>(ctx, big, opt_big, d, 32, 1);
    train_step<P>(ctx, small, opt_small, d, 8, 4);
  }
  CHECK(opt_small.applied_steps() == 3);
  CHECK(opt_small.scaler().stats().steps == 3);  // the scale stayed fixed inside each window
  const auto wb = download(ctx, Span<const typename P::param_type>(big.parameters().template arena<nn::role::weight>().values()));
  const auto ws = download(ctx, Span<const typename P::param_type>(small.parameters().template arena<nn::role::weight>().values()));
  const double tol = std::is_same_v<typename P::param_type, float> ? 1e-5 : 2e-3;
  for (std::size_t i = 0; i < wb.size(); ++i) REQUIRE(cast<float>(ws[i]) == doctest::Approx(cast<float>(wb[i])).epsilon(tol).scale(1.0));
}

TEST_CASE_TEMPLATE("every level trains a small classifier, and the training steps allocate nothing", P, O0Policy,
                   O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy, AllFp8Policy, CurrentFp8Policy) {
  Context<host> ctx;
  const Data d = make_data(64);
  auto net = make_net<P>(ctx, 64);
  optim::Adam<P, host> opt(net.parameters(), {.lr = 0.02f});
  const std::size_t allocations = ctx.memory().allocations();  // everything is sized at build
  const float first = train_step<P>(ctx, net, opt, d, 64, 1);
  float last = first;
  for (int i = 0; i < 60; ++i) last = train_step<P>(ctx, net, opt, d, 64, 1);
  CHECK(ctx.memory().allocations() == allocations);
  CHECK(std::isfinite(last));
  CHECK(last < 0.5f * first);
  CHECK(opt.scaler().stats().skipped == 0);
}

TEST_CASE("O1 casts the fp32 weights to fp16 once per step, not once per use") {
  Context<host> ctx;
  const Data d = make_data(16);
  auto net = make_net<O1Policy>(ctx, 16);
  optim::SGD<O1Policy, host> opt(net.parameters(), {.lr = 0.1f});
  const auto x = matrix<const float>(d.x.data(), 16, 8);
  net.forward(ctx, x);
  net.forward(ctx, x);
  CHECK(net.parameters().cast_cache_refreshes() == 1);
  train_step<O1Policy>(ctx, net, opt, d, 16, 1);  // forward reuses the cache, the step invalidates it
  CHECK(net.parameters().cast_cache_refreshes() == 1);
  net.forward(ctx, x);
  net.forward(ctx, x);
  CHECK(net.parameters().cast_cache_refreshes() == 2);
  // Weight gradients land in fp32 straight from the GEMM.
  static_assert(std::is_same_v<nn::RoleArena<O1Policy, host, nn::role::weight>::grad_type, float>);
}

TEST_CASE("the explicit scaler form (scale, unscale, step, update) matches the three-line form") {
  Context<host> ctx;
  const Data d = make_data(16);
  auto a = make_net<O2Policy>(ctx, 16);
  auto b = make_net<O2Policy>(ctx, 16);
  optim::SGD<O2Policy, host> opt_a(a.parameters(), {.lr = 0.2f});
  optim::SGD<O2Policy, host> opt_b(b.parameters(), {.lr = 0.2f});
  DynamicLossScaler<host> scaler(ctx);
  const auto x = matrix<const float>(d.x.data(), 16, 8);
  const Span<const std::int32_t> labels{d.labels.data(), 16};
  for (int i = 0; i < 5; ++i) {
    train_step<O2Policy>(ctx, a, opt_a, d, 16, 1);

    auto loss = nn::cross_entropy(ctx, b.forward(ctx, x), labels);
    opt_b.zero_grad();
    {
      auto scaled = scaler.scale(loss);
      scaled.backward();
    }
    scaler.unscale(opt_b);  // grads now unscaled, e.g. for inspection
    scaler.step(opt_b);
    scaler.update();
  }
  CHECK(scaler.stats().steps == 5);
  const auto wa = download(ctx, Span<const float>(a.parameters().arena<nn::role::weight>().master()));
  const auto wb = download(ctx, Span<const float>(b.parameters().arena<nn::role::weight>().master()));
  for (std::size_t i = 0; i < wa.size(); ++i) REQUIRE(wb[i] == doctest::Approx(wa[i]).epsilon(1e-3).scale(1.0));
}
