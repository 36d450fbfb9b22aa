// What a newcomer writes from PyTorch habits gets PyTorch's answer: a schedule
// without base_lr starts from the optimizer's rate, AdamW's default weight
// decay is 0.01, a loader's TensorView is a loss target, and clip_grad_norm
// clips and returns the unscaled global norm. Each against its closed form.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "amp/amp.hpp"
#include "support/param_fixture.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

TEST_CASE("a schedule without base_lr starts from the optimizer's rate; a misconfigured one names its field") {
  Context<host> ctx;
  ParamFixture<O0Policy, host> f(ctx, {0.0f});
  optim::SGD<O0Policy, host> opt(*f.params, {.lr = 0.2f});
  opt.set_schedule(optim::CosineLR{.total_steps = 4, .min_lr = 0.02f});
  double w = 0.0;
  for (int t = 0; t < 6; ++t) {
    const double rate = t >= 4 ? 0.02 : 0.02 + 0.5 * (0.2 - 0.02) * (1 + std::cos(3.141592653589793 * t / 4));
    CHECK(opt.lr() == doctest::Approx(rate).epsilon(1e-6));
    f.set_grads({1.0f});
    opt.step();
    w -= rate;
  }
  CHECK(f.values()[0] == doctest::Approx(w).epsilon(1e-6));

  // Warmup and StepLR take the rate the optimizer has when the schedule is set.
  opt.set_lr(0.4f);
  opt.set_schedule(optim::LinearWarmup<optim::StepLR>{.warmup_steps = 2, .inner = {.step_size = 1, .gamma = 0.5f}});
  opt.set_steps(0);
  CHECK(opt.lr() == doctest::Approx(0.2));  // 0.4 x 1/2 of the ramp
  opt.set_steps(3);
  CHECK(opt.lr() == doctest::Approx(0.2));  // step 1 of StepLR: 0.4 x 0.5
  opt.set_schedule(optim::CosineLR{.base_lr = 1.0f, .total_steps = 10});  // a base of its own wins
  opt.set_steps(0);
  CHECK(opt.lr() == 1.0f);

  CHECK_THROWS_WITH_AS(opt.set_schedule(optim::CosineLR{.base_lr = 0.1f}),
                       doctest::Contains("CosineLR: total_steps must be > 0, got 0"), Error);
  CHECK_THROWS_WITH_AS(opt.set_schedule(optim::CosineLR{.base_lr = -0.1f, .total_steps = 5}),
                       doctest::Contains("CosineLR: base_lr must be finite and >= 0, got -0.1"), Error);
  CHECK_THROWS_WITH_AS(opt.set_schedule(optim::StepLR{.step_size = 0}),
                       doctest::Contains("StepLR: step_size must be > 0, got 0"), Error);
  CHECK_THROWS_WITH_AS(optim::CosineLR{.total_steps = 5}(0), doctest::Contains("CosineLR: evaluated on its own"), Error);
  optim::Schedule bad;
  bad.k = optim::Schedule::kind::cosine, bad.total_steps = 3, bad.min_lr = -1.0f;
  CHECK_THROWS_WITH_AS(opt.set_schedule(bad), doctest::Contains("need a finite min_lr >= 0, got -1"), Error);
  CHECK(opt.lr() == 1.0f);  // refused schedules change nothing
}

TEST_CASE("AdamW's default weight decay is PyTorch's 0.01, Adam's 0, whatever other options are given") {
  const float w0 = 2.0f, g = 0.5f, lr = 0.1f;
  for (const bool decoupled : {false, true}) {
    CAPTURE(decoupled);
    Context<host> ctx;
    ParamFixture<O0Policy, host> f(ctx, {w0});
    f.set_grads({g});
    double expect = w0;
    if (decoupled) {
      optim::AdamW<O0Policy, host> opt(*f.params, {.lr = lr});
      opt.step();
      expect -= lr * 0.01 * w0;  // decoupled decay first, then the bias-corrected step: m/sqrt(v) = g/|g|
    } else {
      optim::Adam<O0Policy, host> opt(*f.params, {.lr = lr});
      opt.step();
    }
    expect -= lr * g / (std::abs(g) + 1e-8);
    CHECK(f.values()[0] == doctest::Approx(expect).epsilon(1e-7));
  }
  Context<host> ctx;
  ParamFixture<O0Policy, host> f(ctx, {w0});
  f.set_grads({g});
  optim::AdamW<O0Policy, host> opt(*f.params, {.lr = lr, .weight_decay = 0.0f});  // an explicit 0 stays 0
  opt.step();
  CHECK(f.values()[0] == doctest::Approx(w0 - lr * g / (g + 1e-8)).epsilon(1e-7));
  using AdamW = optim::AdamW<O0Policy, host>;
  CHECK_THROWS_WITH_AS(AdamW(*f.params, {.weight_decay = -1.0f}),
                       doctest::Contains("AdamW: weight_decay must be >= 0, got -1"), Error);
}

namespace {
template <class P, class B>
struct Affine {
  using T = typename P::activation_type;
  nn::Linear<P, B> fc;
  explicit Affine(nn::Builder<P, B> b) : fc(b.child("fc"), {.in_features = 3, .out_features = 4}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{3}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) { return fc(g, x); }
};
}  // namespace

TEST_CASE("mse_loss and bce_with_logits take a TensorView target of the prediction's shape") {
  Context<host> ctx;
  nn::Model<O0Policy, host, Affine<O0Policy, host>> model(ctx, {.max_batch = 2, .seed = 1});
  const std::vector<float> x{0.5f, -1.0f, 0.25f, 1.5f, 0.0f, -0.5f}, t{1, 0, 0, 1, 0, 1, 1, 0};
  auto out = model.forward(ctx, TensorView<const float>(x.data(), Shape{2, 3}));
  const auto y = out.value();
  const auto pred = download(ctx, Span<const float>(y.data, 8));
  double expect = 0;
  for (std::size_t i = 0; i < 8; ++i) expect += (pred[i] - t[i]) * (pred[i] - t[i]) / 8;
  const TensorView<const float> target(t.data(), Shape{2, 4});
  CHECK(nn::mse_loss(ctx, out, target).item() == doctest::Approx(expect).epsilon(1e-6));
  CHECK(nn::mse_loss(ctx, out, target).item() == nn::mse_loss(ctx, out, target.matrix()).item());
  CHECK(nn::bce_with_logits(ctx, out, target).item() == nn::bce_with_logits(ctx, out, target.matrix()).item());
  CHECK_THROWS_WITH_AS(nn::mse_loss(ctx, out, TensorView<const float>(t.data(), Shape{2, 2, 2})),
                       doctest::Contains("mse_loss: prediction [2x4] and target [2x2x2] differ in shape"), Error);
}

TEST_CASE("clip_grad_norm unscales, clips and returns the unscaled global norm, as clip_grad_norm_") {
  Context<host> ctx;
  ParamFixture<O2Policy, host> f(ctx, {1.0f, 1.0f});  // fp16 gradients, a dynamic scaler at 2^16
  optim::SGD<O2Policy, host> opt(*f.params, {.lr = 1.0f});
  const float scale = opt.scaler().stats().scale;
  REQUIRE(scale == 65536.0f);
  f.set_grads({3.0f * scale / 1024, 4.0f * scale / 1024});  // unscaled: 3/1024, 4/1024, norm 5/1024
  scaled_by_hand(opt.scaler());  // as amp::scale_loss(loss, opt).backward() declares
  const float norm = opt.clip_grad_norm(1.0f / 1024);
  CHECK(norm == doctest::Approx(5.0 / 1024).epsilon(1e-6));
  const auto g = opt.gradients().unscaled(*f.params, 0);  // clipped in place, as PyTorch's
  const double coef = (1.0 / 1024) / (5.0 / 1024 + 1e-6);
  CHECK(g[0] == doctest::Approx(3.0 / 1024 * coef).epsilon(1e-6));
  CHECK(g[1] == doctest::Approx(4.0 / 1024 * coef).epsilon(1e-6));
  opt.step();
  const auto w = f.values();
  CHECK(w[0] == doctest::Approx(1.0 - 3.0 / 1024 * coef).epsilon(1e-6));
  CHECK(w[1] == doctest::Approx(1.0 - 4.0 / 1024 * coef).epsilon(1e-6));

  // Below max_norm nothing changes; the norm still comes back.
  f.set_grads({0.5f * scale, 0.75f * scale});
  scaled_by_hand(opt.scaler());
  CHECK(opt.clip_grad_norm(2.0f) == doctest::Approx(std::sqrt(0.8125)).epsilon(1e-6));
  opt.step();
  CHECK(f.values()[0] == doctest::Approx(w[0] - 0.5).epsilon(1e-6));

  // An overflow: the norm is inf and the step is skipped.
  f.set_grads({std::numeric_limits<float>::infinity(), 1.0f});
  scaled_by_hand(opt.scaler());
  const auto before = f.values();
  CHECK(std::isinf(opt.clip_grad_norm(1.0f)));
  opt.step();
  CHECK(f.values() == before);
  CHECK_THROWS_WITH_AS(opt.clip_grad_norm(0.0f), doctest::Contains("max_norm must be finite and > 0, got 0"), Error);
}

TEST_CASE("clip_grad_norm after another scaler's backward needs that scaler's unscale first") {
  Context<host> ctx;
  ParamFixture<O2Policy, host> f(ctx, {1.0f, 1.0f});
  optim::SGD<O2Policy, host> opt(*f.params, {.lr = 1.0f});
  default_scaler_t<O2Policy, host> scaler(ctx, {.init_scale = 1024.0f});  // not the optimizer's 2^16
  f.set_grads({3.0f * 1024, 4.0f * 1024});
  scaled_by_hand(scaler);  // as scaler.scale(loss).backward() declares
  CHECK_THROWS_WITH_AS(opt.clip_grad_norm(1.0f), doctest::Contains("call scaler.unscale(opt)"), Error);
  scaler.unscale(opt);
  CHECK(opt.clip_grad_norm(10.0f) == doctest::Approx(5.0).epsilon(1e-6));  // divided by 1024, not 2^16
  scaler.step(opt);
  scaler.update();
  CHECK(f.values()[0] == doctest::Approx(1.0 - 3.0).epsilon(1e-3));
}

TEST_CASE("clip_grad_norm under gradient accumulation clips the mean the step applies") {
  Context<host> ctx;
  ParamFixture<O0Policy, host> f(ctx, {0.0f, 0.0f});
  optim::SGD<O0Policy, host> opt(*f.params, {.lr = 1.0f}, {.accumulation_steps = 2});
  f.set_grads({3.0f, 4.0f});  // the first micro-batch's gradients
  CHECK_THROWS_WITH_AS(opt.clip_grad_norm(1.0f), doctest::Contains("after the last of the 2 accumulated"), Error);
  opt.step();                 // the first micro-batch: no step
  f.set_grads({6.0f, 8.0f});  // the second's added: the sum of two, mean (3, 4), norm 5
  CHECK(opt.clip_grad_norm(1.0f) == doctest::Approx(5.0).epsilon(1e-6));
  opt.step();
  const auto w = f.values();
  CHECK(w[0] == doctest::Approx(-3.0 / (5.0 + 1e-6)).epsilon(1e-6));
  CHECK(w[1] == doctest::Approx(-4.0 / (5.0 + 1e-6)).epsilon(1e-6));
}
