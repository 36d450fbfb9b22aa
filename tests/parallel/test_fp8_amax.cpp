// FP8 amaxes across data-parallel ranks (Transformer Engine's reduce_amax),
// on the host over MPI, run as 2 ranks (in amp_parallel_tests): with the
// maximum over the ranks, 2 ranks of B rows scale their FP8 operands as one
// process with the 2B rows; without it, each rank scales by its own half.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "parallel/harness.hpp"
#include "support/no_host_work.hpp"

using namespace amp;
using namespace amp::test;

namespace {
// O2-fp8's scales follow the largest amax of the last 1024 steps; with a history of 1, each step's own.
struct O2FP8History1 : O2FP8Policy {
  using fp8 = Fp8<DelayedScaling<1>>;
  static constexpr std::string_view name = "O2-fp8, history 1";
};
// The first and last Linear stay in bf16: the middle one runs in FP8.
template <Policy P>
using Net = nn::Sequential<P, host, nn::Linear, nn::ReLU, nn::Linear, nn::ReLU, nn::Linear>;
constexpr std::int64_t B = 16, hidden = 32;
constexpr std::size_t input = 0, grad = 2;

template <Policy P>
Net<P> make_net(Context<host>& ctx, std::int64_t max_batch, nn::Shard shard = {}) {
  return Net<P>(ctx, {.max_batch = max_batch, .seed = 17, .shard = shard},
                {.in_features = features, .out_features = hidden}, {}, {.in_features = hidden, .out_features = hidden},
                {}, {.in_features = hidden, .out_features = classes});
}
template <Policy P>
optim::SGD<P, host> make_sgd(Net<P>& net) {
  return optim::SGD<P, host>(net.parameters(), {.lr = 0.1f, .momentum = 0.9f});
}
template <Policy P>
std::vector<float> scales(Context<host>& ctx, Net<P>& net) {
  return download(ctx, Span<const float>(net.parameters().fp8().scale_values()));
}
std::int64_t bits(const std::vector<float>& v) {
  return static_cast<std::int64_t>(fnv1a(v.data(), v.size() * sizeof(float)));
}
// Every rank's value of x.
std::vector<float> gathered(float x) {
  std::vector<float> out;
  for (auto v : world->all_gather(std::bit_cast<std::int32_t>(x)))
    out.push_back(std::bit_cast<float>(static_cast<std::int32_t>(v)));
  return out;
}
// The scales of the Linears that run in FP8 (the others keep scale 1): input, weight, grad of each.
template <Policy P>
std::vector<float> fp8_scales(Context<host>& ctx, Net<P>& net) {
  const auto all = scales(ctx, net);
  std::vector<float> out;
  const auto& layers = net.parameters().fp8().layers();
  for (std::size_t l = 0; l < layers.size(); ++l)
    if (layers[l].enabled)
      for (std::size_t o = 0; o < nn::fp8_operands; ++o) out.push_back(all[l * nn::fp8_operands + o]);
  return out;
}
double relative(float a, float b) { return std::abs(static_cast<double>(a) - b) / std::abs(static_cast<double>(b)); }
}  // namespace

TEST_CASE("FP8 amax over 2 ranks: every rank starts from rank 0's FP8 scaling state") {
  using P = O2FP8Policy;
  Context<host> ctx(1);
  auto net = make_net<P>(ctx, B);
  auto opt = make_sgd(net);
  auto& fp8 = net.parameters().fp8();
  const std::vector<float> mine(fp8.operands(), 2.0f + static_cast<float>(world->rank()));  // a resumed rank 0, say
  upload(ctx, fp8.scale_values(), mine);
  upload(ctx, fp8.history_values().subspan(0, mine.size()), mine);
  fp8.refresh_inverses();
  parallel::DataParallel ddp(*world, opt);
  CHECK(scales(ctx, net) == std::vector<float>(fp8.operands(), 2.0f));
  CHECK(download(ctx, Span<const float>(fp8.history_values().subspan(0, mine.size()))) ==
        std::vector<float>(mine.size(), 2.0f));
  CHECK(download_one(ctx, static_cast<const float*>(fp8.meta(0, nn::fp8_operand::grad).scale_inv)) == 0.5f);
}

// Step 1 starts from the same weights: every forward row is the one process's
// row, so the maximum over the ranks of the input and weight amaxes is the
// global amax, bit for bit (a maximum rounds nothing). Each rank's loss is the
// mean over its B rows (data parallel's 1/ranks comes later, in the unscale),
// so its output gradients are the one process's times 2, exactly (a power of
// two, in every rounding and FP8 code): its grad scale is exactly half.
// After step 1 the weights differ by the rounding of the split gradient sums
// (each rank's bf16 sum, then their sum), and amaxes, scales and losses by
// what that does to them: measured over 8 steps, at most 0.7% for the
// scales (history 1: each step's own amaxes) and 0.2% for the losses; the
// bounds leave twice that.
TEST_CASE_TEMPLATE("FP8 amax over 2 ranks: the scales and losses of one process with the global batch", P,
                   O2FP8Policy, O2FP8History1) {
  constexpr int steps = 8;
  Context<host> ctx(1);
  auto net = make_net<P>(ctx, B), ref = make_net<P>(ctx, 2 * B);
  auto opt = make_sgd(net), opt_ref = make_sgd(ref);
  parallel::DataParallel ddp(*world, opt, {.bucket_bytes = 256});
  double worst_scale = 0, worst_loss = 0;
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    const Batch b = global_batch(2 * B, step);
    const auto halves = gathered(train_on(ctx, net, opt, b, world->rank() * B, B));
    opt.step();
    const float loss_ref = train_on(ctx, ref, opt_ref, b, 0, 2 * B);
    opt_ref.step();
    const auto s = fp8_scales(ctx, net), s_ref = fp8_scales(ctx, ref);
    REQUIRE(s.size() == nn::fp8_operands);  // the middle Linear
    REQUIRE(same_on_every_rank(bits(scales(ctx, net))));  // every rank scales alike
    for (std::size_t i = 0; i < s.size(); ++i) {
      const float want = i == grad ? s_ref[i] / 2 : s_ref[i];
      if (step == 0) CHECK(s[i] == want);
      worst_scale = std::max(worst_scale, relative(s[i], want));
    }
    worst_loss = std::max(worst_loss, relative((halves[0] + halves[1]) / 2, loss_ref));
    // Step 1: the same row losses, summed in fp32 in two halves or at once: within 31 roundings of 2^-24.
    if (step == 0) CHECK(relative((halves[0] + halves[1]) / 2, loss_ref) <= 0x1p-19);
  }
  if (world->rank() == 0)
    std::printf("[fp8 amax] %s, %d steps: max relative |2 ranks - 1 process|: scales %.3g, losses %.3g\n",
                std::string(P::name).c_str(), steps, worst_scale, worst_loss);
  CHECK(worst_scale <= 0x1p-6);
  CHECK(worst_loss <= 0x1p-8);
}

// Without the maximum each rank's scales follow its own half: the ranks
// differ, and the one process's input scale (its global amax) is the smaller
// of the two ranks' (the larger amax), bit for bit.
TEST_CASE("FP8 amax over 2 ranks: reduce_fp8_amax = false keeps each rank's own scales") {
  using P = O2FP8Policy;
  Context<host> ctx(1);
  auto net = make_net<P>(ctx, B), ref = make_net<P>(ctx, 2 * B);
  auto opt = make_sgd(net), opt_ref = make_sgd(ref);
  parallel::DataParallel ddp(*world, opt, {.reduce_fp8_amax = false});
  const Batch b = global_batch(2 * B, 0);
  train_on(ctx, net, opt, b, world->rank() * B, B);
  opt.step();
  train_on(ctx, ref, opt_ref, b, 0, 2 * B);
  opt_ref.step();
  CHECK_FALSE(same_on_every_rank(bits(scales(ctx, net))));
  const auto inputs = gathered(fp8_scales(ctx, net)[input]);
  CHECK(inputs[0] != inputs[1]);
  CHECK(std::min(inputs[0], inputs[1]) == fp8_scales(ctx, ref)[input]);
}

// ZeRO-1 steps bit for bit as data parallel without it (test_zero.cpp), so
// the reduced amaxes and the scales are the same bits too, on every rank.
TEST_CASE("FP8 amax over 2 ranks under ZeRO-1: the scales of data parallel without it") {
  using P = O2FP8History1;  // every step's scales from its own amaxes
  Context<host> zctx(1), dctx(1);
  auto zero = make_net<P>(zctx, B, {world->rank(), world->size()}), plain = make_net<P>(dctx, B);
  auto zopt = make_sgd(zero), dopt = make_sgd(plain);
  parallel::DataParallel zddp(*world, zopt, {.bucket_bytes = 256, .zero = 1});
  parallel::DataParallel dddp(*world, dopt, {.bucket_bytes = 256});
  for (int step = 0; step < 6; ++step) {
    CAPTURE(step);
    const Batch b = global_batch(2 * B, step);
    const float zloss = train_on(zctx, zero, zopt, b, world->rank() * B, B);
    const float dloss = train_on(dctx, plain, dopt, b, world->rank() * B, B);
    zopt.step();
    dopt.step();
    const auto s = scales(zctx, zero);
    REQUIRE(same_on_every_rank(bits(s)));
    CHECK(s == scales(dctx, plain));
    CHECK(zloss == dloss);
  }
}

// A captured step replays the amax reduction (an MPI call issued on the
// context): its scales are the eager steps', with and without ZeRO-1; an
// eager step after the first does no host work (the reduction needs no sync).
TEST_CASE("FP8 amax over 2 ranks: a captured step reduces as the eager steps, which do no host work") {
  using P = O2FP8History1;
  for (const bool zero : {false, true}) {
    CAPTURE(zero);
    struct Staged {
      Context<host>& ctx;
      Net<P> net;
      optim::SGD<P, host> opt;
      parallel::DataParallel<optim::SGD<P, host>> ddp;
      Buffer<float, host> x;
      Buffer<std::int32_t, host> y;
      Staged(Context<host>& c, bool z)
          : ctx(c), net(make_net<P>(c, B, z ? nn::Shard{world->rank(), world->size()} : nn::Shard{})),
            opt(make_sgd(net)), ddp(*world, opt, {.bucket_bytes = 256, .zero = z ? 1 : 0}),
            x(c, B * features, memory_kind::data), y(c, B, memory_kind::data) {}
      void load(int step) {
        const Batch b = global_batch(2 * B, step);
        upload(ctx, x.span(), b.x.data() + world->rank() * B * features, static_cast<std::size_t>(B * features));
        upload(ctx, y.span(), b.labels.data() + world->rank() * B, static_cast<std::size_t>(B));
      }
      void step() {
        auto loss = nn::cross_entropy(ctx, net.forward(ctx, matrix<const float>(x.data(), B, features)),
                                      Span<const std::int32_t>(y.span()));
        opt.zero_grad();
        {
          auto scaled = scale_loss(loss, opt);
          scaled.backward();
        }
        opt.step();
      }
    };
    Context<host> ctx(1);
    Staged eager(ctx, zero), replayed(ctx, zero);
    eager.load(0);
    eager.step();
    replayed.load(0);
    CapturedStep step(ctx, [&] { replayed.step(); });
    CHECK(scales(ctx, replayed.net) == scales(ctx, eager.net));
    for (int s = 1; s < 5; ++s) {
      eager.load(s);
      const Counters before = ctx.counters();
      eager.step();
      test::check_no_host_work(ctx.counters() - before);
      replayed.load(s);
      step.replay();
      CHECK(scales(ctx, replayed.net) == scales(ctx, eager.net));
    }
    CHECK(same_on_every_rank(bits(scales(ctx, replayed.net))));
    CHECK(fingerprint(replayed.net.parameters()) == fingerprint(eager.net.parameters()));
  }
}
