// CUDA twins of the training-core tests: the same models, data and steps on
// the GPU and the CPU must agree at every level (MLP, CNN, a residual block;
// the transformers are test_cuda_transformer.cu's),
// the scaler's skip must be bit-exact on the device, and the host-computed
// initialisation and the dropout masks must give the same bits on both.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "amp/amp.hpp"
#include "cuda/twins.hpp"
#include "support/gpu.cuh"
#include "support/param_fixture.hpp"
#include "support/policies.hpp"
#include "support/reference.hpp"

using namespace amp::test;
using amp::Context;
using amp::Policy;
namespace nn = amp::nn;

namespace {
template <class P, class B>
struct SmallCnn {
  using T = typename P::activation_type;
  nn::Conv2d<P, B> c1, c2;
  nn::BatchNorm2d<P, B> bn;
  nn::MaxPool2d<P, B> pool;
  nn::GlobalAvgPool<P, B> gap;
  nn::Linear<P, B> fc;
  explicit SmallCnn(nn::Builder<P, B> b)
      : c1(b.child("c1"), {.in_channels = 1, .out_channels = 8, .kernel = 3, .padding = 1, .bias = false}),
        c2(b.child("c2"), {.in_channels = 8, .out_channels = 8, .kernel = 3, .padding = 1, .act = amp::activation::relu}),
        bn(b.child("bn"), {.features = 8}),
        pool(b.child("pool"), {.kernel = 2}),
        gap(b.child("gap"), {}),
        fc(b.child("fc"), {.in_features = 8, .out_features = 5}) {}
  std::vector<nn::Input> default_inputs() const { return {{amp::Shape{8, 8, 1}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) {
    const nn::Var<T> h = pool(g, nn::relu(g, bn(g, c1(g, x))));
    return fc(g, gap(g, nn::add(g, c2(g, h), h)));  // a residual add
  }
};

template <class P, class B>
using Mlp = nn::Sequential<P, B, nn::Linear, nn::Linear>;
// The head kept in fp32 (a layer policy): its own role, its fp32 GEMM on cuBLAS.
template <class P, class B>
using Fp32Linear = nn::Linear<amp::KeepFp32<P>, B>;
template <class P, class B>
using MlpFp32Head = nn::Sequential<P, B, nn::Linear, Fp32Linear>;

// 5 Adam steps on (x, labels); the fp32 view of every parameter afterwards.
template <class Model, class B>
std::vector<float> train(Model& model, Context<B>& ctx, const std::vector<float>& x, amp::Shape shape,
                         const std::vector<std::int32_t>& labels) {
  using P = typename Model::policy;
  amp::optim::Adam<P, B> opt(model.parameters(), {.lr = 0.01f});
  amp::Buffer<float, B> dx(ctx, x.size(), amp::memory_kind::activations);
  amp::Buffer<std::int32_t, B> dl(ctx, labels.size(), amp::memory_kind::activations);
  amp::upload(ctx, dx.span(), x);
  amp::upload(ctx, dl.span(), labels);
  for (int i = 0; i < 5; ++i) {
    auto out = model.forward(ctx, amp::TensorView<const float>(dx.data(), shape));
    auto loss = nn::cross_entropy(ctx, out, amp::Span<const std::int32_t>(dl.span()));
    opt.zero_grad();
    {
      auto scaled = amp::scale_loss(loss, opt);
      scaled.backward();
    }
    opt.step();
  }
  return all_values(model);
}

}  // namespace

TEST_CASE_TEMPLATE("cuda: MLP training steps match the host backend at every level", P, amp::O0Policy, amp::O1Policy,
                   amp::O2Policy, amp::O3Policy, amp::O1BF16Policy, amp::O2BF16Policy, AllFp8Policy,
                   CurrentFp8Policy) {
  AMP_REQUIRE_GPU();
  const auto x = random_values<float>(32 * 20, 4);
  std::vector<std::int32_t> labels(32);
  for (int r = 0; r < 32; ++r) labels[r] = r % 5;
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  Mlp<P, amp::cuda> mg(gpu, {.max_batch = 32, .seed = 7}, {.in_features = 20, .out_features = 24, .act = amp::activation::gelu},
                       {.in_features = 24, .out_features = 5});
  Mlp<P, amp::host> mc(cpu, {.max_batch = 32, .seed = 7}, {.in_features = 20, .out_features = 24, .act = amp::activation::gelu},
                       {.in_features = 24, .out_features = 5});
  compare<P>(train(mg, gpu, x, amp::Shape{32, 20}, labels), train(mc, cpu, x, amp::Shape{32, 20}, labels));
}

TEST_CASE_TEMPLATE("cuda: a head kept in fp32 (KeepFp32) trains as on the host", P, amp::O2Policy, amp::O3Policy,
                   amp::O2BF16Policy, AllFp8Policy) {
  AMP_REQUIRE_GPU();
  const auto x = random_values<float>(32 * 20, 4);
  std::vector<std::int32_t> labels(32);
  for (int r = 0; r < 32; ++r) labels[r] = r % 5;
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  MlpFp32Head<P, amp::cuda> mg(gpu, {.max_batch = 32, .seed = 7}, {.in_features = 20, .out_features = 24},
                               {.in_features = 24, .out_features = 5});
  MlpFp32Head<P, amp::host> mc(cpu, {.max_batch = 32, .seed = 7}, {.in_features = 20, .out_features = 24},
                               {.in_features = 24, .out_features = 5});
  CHECK(mg.parameters().table()[2].kind == nn::role::fp32);
  compare<P>(train(mg, gpu, x, amp::Shape{32, 20}, labels), train(mc, cpu, x, amp::Shape{32, 20}, labels));
}

// The numerics report's rows after two reported steps (the first at the initial weights).
template <class Model, class B>
std::vector<nn::NumericsRow> report_rows(Model& model, Context<B>& ctx, const std::vector<float>& x, amp::Shape shape,
                                         const std::vector<std::int32_t>& labels) {
  train(model, ctx, x, shape, labels);  // 5 steps: reported, as numerics_every = 2, steps 0, 2 and 4
  return model.parameters().numerics().take();
}

TEST_CASE_TEMPLATE("cuda: the numerics report (parameters, gradients, layer outputs, FP8 operands) matches the host's",
                   P, amp::O2Policy, amp::O2BF16Policy, AllFp8Policy) {
  AMP_REQUIRE_GPU();
  const auto x = random_values<float>(32 * 32, 5);
  std::vector<std::int32_t> labels(32);
  for (int r = 0; r < 32; ++r) labels[r] = r % 5;
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  const nn::ModelOptions options{.max_batch = 32, .seed = 7, .numerics_every = 2};
  Mlp<P, amp::cuda> mg(gpu, options, {.in_features = 32, .out_features = 32}, {.in_features = 32, .out_features = 5});
  Mlp<P, amp::host> mc(cpu, options, {.in_features = 32, .out_features = 32}, {.in_features = 32, .out_features = 5});
  const auto rg = report_rows(mg, gpu, x, amp::Shape{32, 32}, labels);
  const auto rc = report_rows(mc, cpu, x, amp::Shape{32, 32}, labels);
  REQUIRE(rg.size() == rc.size());
  REQUIRE(!rc.empty());
  for (std::size_t i = 0; i < rc.size(); ++i) {
    const nn::NumericsRow &g = rg[i], &c = rc[i];
    CAPTURE(c.step);
    CAPTURE(c.tensor);
    CAPTURE(c.kind);
    CHECK(g.step == c.step);
    CHECK(g.tensor == c.tensor);
    CHECK(g.kind == c.kind);
    CHECK(g.dtype == c.dtype);
    CHECK(g.count == c.count);
    CHECK(g.overflow == c.overflow);
    if (c.step == 0 && c.kind == "parameter") {  // the same initial bits
      CHECK(g.amax == c.amax);
      CHECK(g.zero == c.zero);
      CHECK(g.underflow == c.underflow);
    } else {  // cuBLAS and CUB sum in another order than the CPU
      CHECK(g.amax == doctest::Approx(c.amax).epsilon(0.02));
      CHECK(std::abs(g.zero - c.zero) <= 0.02);
      CHECK(std::abs(g.subnormal - c.subnormal) <= 0.02);
      CHECK(g.scale == doctest::Approx(c.scale).epsilon(c.kind == "fp8" ? 0.1 : 0.0));
    }
  }
}

// cuBLASLt's FP8 kernels (every dimension a multiple of 16) against the host's emulation; the MLP case above
// (20, 24, 5) takes the decode fallback.
TEST_CASE_TEMPLATE("cuda: O2-fp8 training on cuBLASLt's FP8 GEMMs matches the host's exact emulation", P, AllFp8Policy,
                   CurrentFp8Policy) {
  AMP_REQUIRE_GPU();
  const auto x = random_values<float>(32 * 32, 8);
  std::vector<std::int32_t> labels(32);
  for (int r = 0; r < 32; ++r) labels[r] = (r * 3) % 16;
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  Mlp<P, amp::cuda> mg(gpu, {.max_batch = 32, .seed = 9}, {.in_features = 32, .out_features = 64, .act = amp::activation::gelu},
                       {.in_features = 64, .out_features = 16});
  Mlp<P, amp::host> mc(cpu, {.max_batch = 32, .seed = 9}, {.in_features = 32, .out_features = 64, .act = amp::activation::gelu},
                       {.in_features = 64, .out_features = 16});
  const std::size_t plans = gpu.lt_plans().size();
  compare<P>(train(mg, gpu, x, amp::Shape{32, 32}, labels), train(mc, cpu, x, amp::Shape{32, 32}, labels));
  CHECK(gpu.lt_plans().size() > plans);
  const auto sg = download(gpu, amp::Span<const float>(mg.parameters().fp8().scale_values()));
  const auto sc = download(cpu, amp::Span<const float>(mc.parameters().fp8().scale_values()));
  REQUIRE(sg.size() == sc.size());
  for (std::size_t i = 0; i < sg.size(); ++i) CHECK(sg[i] == doctest::Approx(sc[i]).epsilon(0.01));  // amaxes agree
}

TEST_CASE_TEMPLATE("cuda: CNN training steps (conv, batchnorm, pools, a residual add) match the host at every level", P,
                   amp::O0Policy, amp::O1Policy, amp::O2Policy, amp::O3Policy, amp::O1BF16Policy, amp::O2BF16Policy) {
  AMP_REQUIRE_GPU();
  const auto x = random_values<float>(16 * 64, 5);
  std::vector<std::int32_t> labels(16);
  for (int r = 0; r < 16; ++r) labels[r] = r % 5;
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  nn::Model<P, amp::cuda, SmallCnn<P, amp::cuda>> mg(gpu, {.max_batch = 16, .seed = 3});
  nn::Model<P, amp::host, SmallCnn<P, amp::host>> mc(cpu, {.max_batch = 16, .seed = 3});
  compare<P>(train(mg, gpu, x, amp::Shape{16, 8, 8, 1}, labels), train(mc, cpu, x, amp::Shape{16, 8, 8, 1}, labels));
  if constexpr (nn::Conv2d<P, amp::cuda>::library_candidate) {  // cuDNN planned both; a shape it refused took im2col
    const auto& cudnn = gpu.library_state<amp::detail::CudnnConvState>();
    CHECK(cudnn.size() >= 2);
    CHECK(cudnn.without_engine() < cudnn.size());
    MESSAGE("cuDNN ran ", cudnn.size() - cudnn.without_engine(), " of ", cudnn.size(), " convolution shapes");
  }
}

TEST_CASE("cuda: an overflowing step is skipped on the device, bit for bit, and the scale backs off") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  ParamFixture<amp::O2Policy, amp::cuda> f(ctx, {0.5f, -0.25f, 1.0f});
  amp::optim::SGD<amp::O2Policy, amp::cuda> opt(*f.params, {.lr = 0.1f, .momentum = 0.9f});
  f.set_grads({100.0f, 200.0f, -300.0f});
  opt.step();
  const auto master = f.values();
  const auto momentum = amp::download(ctx, amp::Span<const float>(opt.state_buffer<nn::role::weight>(0)));
  f.set_grads({1.0f, std::numeric_limits<float>::infinity(), 1.0f});
  opt.step();
  CHECK(f.values() == master);
  CHECK(amp::download(ctx, amp::Span<const float>(opt.state_buffer<nn::role::weight>(0))) == momentum);
  const auto s = opt.scaler().stats();
  CHECK(s.scale == 32768.0f);
  CHECK(s.skipped == 1);
  CHECK(opt.applied_steps() == 1);
}

TEST_CASE("cuda: the first parameter with an inf/NaN gradient is found on the device, as on the host") {
  AMP_REQUIRE_GPU();
  const auto x = random_values<float>(8 * 20, 6);
  const std::vector<std::int32_t> labels = {0, 1, 2, 3, 4, 0, 1, 2};
  const auto first_bad = [&]<class B>(Context<B>& ctx) {
    Mlp<amp::O2Policy, B> m(ctx, {.max_batch = 8, .seed = 7, .numerics_every = 1000},
                            {.in_features = 20, .out_features = 24}, {.in_features = 24, .out_features = 5});
    amp::optim::SGD<amp::O2Policy, B> opt(m.parameters(), {.lr = 0.1f});
    amp::Buffer<float, B> dx(ctx, x.size(), amp::memory_kind::activations);
    amp::Buffer<std::int32_t, B> dl(ctx, labels.size(), amp::memory_kind::activations);
    amp::upload(ctx, dx.span(), x);
    amp::upload(ctx, dl.span(), labels);
    auto loss = nn::cross_entropy(ctx, m.forward(ctx, amp::TensorView<const float>(dx.data(), amp::Shape{8, 20})),
                                  amp::Span<const std::int32_t>(dl.span()));
    opt.zero_grad();
    amp::scale_loss(loss, opt).backward();
    const auto& p = m.parameters().table()[2];  // 1.weight, its last element
    const amp::half inf = amp::cast<amp::half>(std::numeric_limits<float>::infinity());
    amp::upload(ctx, m.parameters().template arena<nn::role::weight>().grads().subspan(p.offset + p.count - 1, 1), &inf, 1);
    opt.step();
    return amp::download_one(ctx, static_cast<const std::int32_t*>(m.parameters().numerics().first_nonfinite()));
  };
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  CHECK(first_bad(gpu) == 2);
  CHECK(first_bad(cpu) == 2);
}

TEST_CASE("cuda: one scaler, two optimizers: an overflow skips only its optimizer, on the device") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  ParamFixture<amp::O2Policy, amp::cuda> a(ctx, {1.0f}), b(ctx, {2.0f});
  amp::optim::SGD<amp::O2Policy, amp::cuda> opt_a(*a.params, {.lr = 0.5f}), opt_b(*b.params, {.lr = 0.5f});
  amp::DynamicLossScaler<amp::cuda> scaler(ctx, {.init_scale = 4.0f});
  a.set_grads({4.0f});
  b.set_grads({std::numeric_limits<float>::quiet_NaN()});
  scaler.step(opt_a);
  scaler.step(opt_b);
  scaler.update();
  CHECK(a.values() == std::vector<float>{0.5f});
  CHECK(b.values() == std::vector<float>{2.0f});
  CHECK(scaler.stats().scale == 2.0f);
}

TEST_CASE_TEMPLATE("cuda: two forwards before one backward match the host; a kept loss is exact, a stale one an error", P,
                   amp::O0Policy, amp::O1Policy, amp::O2Policy, amp::O3Policy, amp::O1BF16Policy, amp::O2BF16Policy) {
  AMP_REQUIRE_GPU();
  const auto x = random_values<float>(2 * 4 * 64, 9);
  const std::vector<std::int32_t> labels{0, 1, 2, 1};
  const auto grads_after = [&]<class B>(Context<B>& ctx) {
    Mlp<P, B> model(ctx, {.max_batch = 4, .seed = 3, .forwards_per_iteration = 2}, {.in_features = 64, .out_features = 16},
                    {.in_features = 16, .out_features = 3});
    amp::Buffer<float, B> dx(ctx, x.size(), amp::memory_kind::activations);
    amp::Buffer<std::int32_t, B> dl(ctx, labels.size(), amp::memory_kind::activations);
    amp::upload(ctx, dx.span(), x);
    amp::upload(ctx, dl.span(), labels);
    auto kept = nn::cross_entropy(ctx, model.forward(ctx, amp::matrix<const float>(dx.data(), 4, 64)),
                                  amp::Span<const std::int32_t>(dl.span()));
    auto other = model.forward(ctx, amp::matrix<const float>(dx.data() + 4 * 64, 4, 64));
    model.parameters().zero_grad();
    kept.backward();  // its own gradients: the second forward takes none
    std::vector<float> g;
    for (const auto& info : model.parameters().table()) {
      const amp::nn::Param<amp::nn::role::weight> p{info.offset, info.count, info.shape, 0};
      for (const auto v : amp::download(ctx, amp::Span<const typename P::grad_type>(model.parameters().grads(p))))
        g.push_back(amp::cast<float>(v));
    }
    model.forward(ctx, amp::matrix<const float>(dx.data(), 4, 64));  // a new iteration
    CHECK_THROWS_WITH_AS(kept.backward(), doctest::Contains("is from iteration"), amp::Error);
    CHECK_THROWS_WITH_AS(other.value(), doctest::Contains("is from iteration"), amp::Error);
    return g;
  };
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  const auto gg = grads_after(gpu), gc = grads_after(cpu);
  REQUIRE(gg.size() == gc.size());
  double scale = 0, worst = 0;
  for (std::size_t i = 0; i < gg.size(); ++i)
    scale = std::max(scale, std::abs(double(gc[i]))), worst = std::max(worst, std::abs(double(gg[i]) - gc[i]));
  CHECK(worst <= policy_rtol<P>() * scale + 1e-6);
}

TEST_CASE("cuda: growth after the window, floor, and the divergence error from the lagging mirror") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  ParamFixture<amp::O1Policy, amp::cuda> f(ctx, {0.0f});
  amp::optim::SGD<amp::O1Policy, amp::cuda> opt(
      *f.params, {.lr = 0.0f},
      {.scaler = amp::ScalerConfig{.init_scale = 4.0f, .growth_interval = 3, .min_scale = 1.0f, .max_consecutive_skips = 4}});
  for (int i = 0; i < 3; ++i) {  // each step its own (clean) gradients
    f.set_grads({1.0f});
    opt.step();
  }
  CHECK(opt.scaler().stats().scale == 8.0f);
  bool diverged = false;
  for (int i = 0; i < 20 && !diverged; ++i) {
    try {
      f.set_grads({std::numeric_limits<float>::quiet_NaN()});
      opt.step();
      ctx.synchronize();
    } catch (const amp::Error& e) {
      diverged = std::string(e.what()).find("training diverged") != std::string::npos;
    }
  }
  CHECK(diverged);
  CHECK(opt.scaler().stats().scale == 1.0f);
}

TEST_CASE("cuda: initialisation and dropout masks give the same bits as on the host") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  nn::Sequential<amp::O2Policy, amp::cuda, nn::Linear, nn::Dropout> a(gpu, {.max_batch = 4, .seed = 3},
                                                                        {.in_features = 100, .out_features = 50}, {.p = 0.3f});
  nn::Sequential<amp::O2Policy, amp::host, nn::Linear, nn::Dropout> b(cpu, {.max_batch = 4, .seed = 3},
                                                                        {.in_features = 100, .out_features = 50}, {.p = 0.3f});
  CHECK(a.parameters().get_values(0) == b.parameters().get_values(0));
  const auto x = random_values<float>(4 * 100, 8);
  amp::Buffer<float, amp::cuda> dx(gpu, x.size(), amp::memory_kind::activations);
  amp::upload(gpu, dx.span(), x);
  const auto yg = amp::download(gpu, a.forward(gpu, amp::matrix<const float>(dx.data(), 4, 100)).var.span());
  const auto yc = amp::download(cpu, b.forward(cpu, amp::matrix<const float>(x.data(), 4, 100)).var.span());
  for (std::size_t i = 0; i < yc.size(); ++i)
    REQUIRE((amp::cast<float>(yg[i]) == 0.0f) == (amp::cast<float>(yc[i]) == 0.0f));  // the same mask
}
