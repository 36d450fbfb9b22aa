// CUDA twins of the training-core tests: the same model, data and steps on the
// GPU and the CPU must agree; the scaler's skip must be bit-exact on the device.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "amp/amp.hpp"
#include "support/gpu.cuh"
#include "support/param_fixture.hpp"
#include "support/policies.hpp"
#include "support/reference.hpp"

using namespace amp::test;
using amp::Context;
using amp::Policy;

namespace {
template <Policy P, class B>
using Net = amp::nn::Sequential<P, B, amp::nn::Linear, amp::nn::GELU, amp::nn::Linear>;

// Trains 5 Adam steps on (x, labels) and returns the fp32 view of the weights.
template <Policy P, class B>
std::vector<float> train(Context<B>& ctx, const std::vector<float>& x, const std::vector<std::int32_t>& labels) {
  Net<P, B> net(ctx, {.max_batch = 32, .seed = 7}, {.in_features = 20, .out_features = 24}, {},
                {.in_features = 24, .out_features = 5});
  amp::optim::Adam<P, B> opt(net.parameters(), {.lr = 0.01f});
  amp::Buffer<float, B> dx(ctx, x.size(), amp::memory_kind::activations);
  amp::Buffer<std::int32_t, B> dl(ctx, labels.size(), amp::memory_kind::activations);
  amp::upload(ctx, dx.span(), x);
  amp::upload(ctx, dl.span(), labels);
  for (int i = 0; i < 5; ++i) {
    auto loss = amp::nn::cross_entropy(ctx, net.forward(ctx, amp::matrix<const float>(dx.data(), 32, 20)),
                                       amp::Span<const std::int32_t>(dl.span()));
    opt.zero_grad();
    {
      auto scaled = amp::scale_loss(loss, opt);
      scaled.backward();
    }
    opt.step();
  }
  const auto w = amp::download(ctx, amp::Span<const typename P::param_type>(net.parameters().weights()));
  std::vector<float> out(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) out[i] = amp::cast<float>(w[i]);
  return out;
}
}  // namespace

TEST_CASE_TEMPLATE("cuda: training steps match the host backend at every level", P, amp::O0Policy, amp::O1Policy,
                   amp::O2Policy, amp::O3Policy, amp::O1BF16Policy, amp::O2BF16Policy) {
  AMP_REQUIRE_GPU();
  const auto x = random_values<float>(32 * 20, 4);
  std::vector<std::int32_t> labels(32);
  for (int r = 0; r < 32; ++r) labels[r] = r % 5;
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  const auto wg = train<P>(gpu, x, labels);
  const auto wc = train<P>(cpu, x, labels);
  REQUIRE(wg.size() == wc.size());
  // Both start from the same bits; 5 Adam steps of 0.01 bound the drift by the precision.
  const double tol = 5 * 0.01 * policy_rtol<P>() + 1e-5;
  for (std::size_t i = 0; i < wg.size(); ++i) REQUIRE(std::abs(wg[i] - wc[i]) <= tol);
}

TEST_CASE("cuda: an overflowing step is skipped on the device, bit for bit, and the scale backs off") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  ParamFixture<amp::O2Policy, amp::cuda> f(ctx, {0.5f, -0.25f, 1.0f});
  amp::optim::SGD<amp::O2Policy, amp::cuda> opt(*f.params, {.lr = 0.1f, .momentum = 0.9f});
  f.set_grads({100.0f, 200.0f, -300.0f});
  opt.step();
  const auto master = f.values();
  const auto momentum = amp::download(ctx, opt.state_buffer(0));
  f.set_grads({1.0f, std::numeric_limits<float>::infinity(), 1.0f});
  opt.step();
  CHECK(f.values() == master);
  CHECK(amp::download(ctx, opt.state_buffer(0)) == momentum);
  const auto s = opt.scaler().stats();
  CHECK(s.scale == 32768.0f);
  CHECK(s.skipped == 1);
  CHECK(opt.applied_steps() == 1);
}

TEST_CASE("cuda: growth after the window, floor, and the divergence error from the lagging mirror") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  ParamFixture<amp::O1Policy, amp::cuda> f(ctx, {0.0f});
  amp::optim::SGD<amp::O1Policy, amp::cuda> opt(
      *f.params, {.lr = 0.0f}, {.init_scale = 4.0f, .growth_interval = 3, .min_scale = 1.0f, .max_consecutive_skips = 4});
  f.set_grads({1.0f});
  for (int i = 0; i < 3; ++i) opt.step();
  CHECK(opt.scaler().stats().scale == 8.0f);
  f.set_grads({std::numeric_limits<float>::quiet_NaN()});
  bool diverged = false;
  for (int i = 0; i < 20 && !diverged; ++i) {
    try {
      opt.step();
      ctx.synchronize();
    } catch (const amp::Error& e) {
      diverged = std::string(e.what()).find("training diverged") != std::string::npos;
    }
  }
  CHECK(diverged);
  CHECK(opt.scaler().stats().scale == 1.0f);
}

TEST_CASE("cuda: initialisation gives the same bits as on the host") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  amp::nn::Sequential<amp::O2Policy, amp::cuda, amp::nn::Linear> a(gpu, {.max_batch = 1, .seed = 3},
                                                                   {.in_features = 100, .out_features = 50});
  amp::nn::Sequential<amp::O2Policy, amp::host, amp::nn::Linear> b(cpu, {.max_batch = 1, .seed = 3},
                                                                   {.in_features = 100, .out_features = 50});
  CHECK(amp::download(gpu, amp::Span<const float>(a.parameters().master())) ==
        amp::download(cpu, amp::Span<const float>(b.parameters().master())));
}
