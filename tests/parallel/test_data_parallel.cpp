// Data parallel on the host over MPI, run as 2 ranks:
//   mpirun --allow-run-as-root --oversubscribe -np 2 amp_parallel_tests
// Every rank runs every case; each also trains the single-process reference
// itself (no communication), so the two can be compared on the spot.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "amp/data/loader.hpp"
#include "parallel/harness.hpp"
#include "support/no_host_work.hpp"

using namespace amp;
using amp::host;
using amp::test::values_of;

using namespace amp::test;

TEST_CASE("the job runs as 2 ranks") { REQUIRE(world->size() == 2); }

TEST_CASE("every rank starts from rank 0's parameters, whatever its seed") {
  Context<host> ctx;
  auto net = make_mlp<O2Policy>(ctx, 8, 7 + static_cast<std::uint64_t>(world->rank()));
  optim::SGD<O2Policy, host> opt(net.parameters(), {.lr = 0.1f});
  CHECK_FALSE(same_on_every_rank(fingerprint(net.parameters())));
  parallel::DataParallel ddp(*world, opt);
  CHECK(same_on_every_rank(fingerprint(net.parameters())));
  auto reference = make_mlp<O2Policy>(ctx, 8, 7);  // rank 0's seed
  CHECK(max_abs_difference(values_of(net.parameters()), values_of(reference.parameters())) == 0.0);
}

// 2 ranks x B rows = one process x 2B rows, step by step; buckets of 256 bytes
// so that several start during backward.
TEST_CASE_TEMPLATE("2 ranks with batch B train as one process with batch 2B", P, O0Policy, O2BF16Policy, O2Policy) {
  constexpr std::int64_t B = 16;
  constexpr int steps = 50;
  Context<host> ctx(1);
  auto net = make_mlp<P>(ctx, B, 11);
  auto ref = make_mlp<P>(ctx, 2 * B, 11);
  auto fp32 = make_mlp<O0Policy>(ctx, 2 * B, 11);  // what the level's own rounding moves a run by
  // fp16: a scale at which the sums cannot overflow, so both runs take every step.
  const ScalerConfig scaler{.init_scale = 1024.0f};
  optim::SGD<P, host> opt(net.parameters(), {.lr = 0.1f, .momentum = 0.9f}, {.scaler = scaler});
  optim::SGD<P, host> opt_ref(ref.parameters(), {.lr = 0.1f, .momentum = 0.9f}, {.scaler = scaler});
  optim::SGD<O0Policy, host> opt_fp32(fp32.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  parallel::DataParallel ddp(*world, opt, {.bucket_bytes = 256});
  REQUIRE(ddp.buckets() > 2);
  double worst = 0, first_step = 0;
  for (int step = 0; step < steps; ++step) {
    const Batch b = global_batch(2 * B, step);
    train_on(ctx, net, opt, b, world->rank() * B, B);
    opt.step();
    train_on(ctx, ref, opt_ref, b, 0, 2 * B);
    opt_ref.step();
    train_on(ctx, fp32, opt_fp32, b, 0, 2 * B);
    opt_fp32.step();
    REQUIRE(same_on_every_rank(fingerprint(net.parameters())));  // bit-identical at every step
    if (step > 0) REQUIRE(ddp.started_in_backward() == ddp.buckets());  // every bucket overlapped backward
    worst = std::max(worst, max_abs_difference(values_of(net.parameters()), values_of(ref.parameters())));
    if (step == 0) first_step = worst;
  }
  CHECK(opt.applied_steps() == steps);
  CHECK(opt_ref.applied_steps() == steps);
  // fp32: summation order only. 16-bit gradients: each rank's half-batch sum is
  // rounded to bf16/fp16 before the two are added, one extra rounding: the
  // first step differs by at most lr x that rounding, and over the run the
  // gap stays within what the level's own rounding does to it (the same run in fp32).
  const double level_gap = max_abs_difference(values_of(ref.parameters()), values_of(fp32.parameters()));
  const bool exact = std::is_same_v<P, O0Policy>;
  const double first_bound = exact ? 1e-7 : 0.1 * (std::is_same_v<P, O2Policy> ? 0x1p-10 : 0x1p-7);
  const double bound = exact ? 2e-6 : level_gap;
  if (world->rank() == 0)
    std::printf("[parallel] %s: max |2 ranks - 1 process|: step 1 %.3g (bound %.3g), %d steps %.3g (bound %.3g: "
                "1 process at %s vs fp32)\n",
                std::string(P::name).c_str(), first_step, first_bound, steps, worst, bound, std::string(P::name).c_str());
  CHECK(first_step <= first_bound);
  CHECK(worst <= bound);
}

// One rank's data-parallel training step with SyncBatchNorm, its batch half
// staged into fixed buffers: what a captured step replays. zero: ZeRO-1.
template <Policy P>
struct StagedDdp {
  static constexpr std::int64_t B = 8;
  Context<host>& ctx;
  BnNet<P> net;
  optim::SGD<P, host> opt;
  parallel::DataParallel<optim::SGD<P, host>> ddp;
  Buffer<float, host> x;
  Buffer<std::int32_t, host> y;
  Staging<float, host> stage_x;
  Staging<std::int32_t, host> stage_y;
  StagedDdp(Context<host>& c, bool zero)
      : ctx(c), net(make_bn_net<P>(c, B, world, zero ? nn::Shard{world->rank(), world->size()} : nn::Shard{})),
        opt(net.parameters(), {.lr = 0.1f, .momentum = 0.9f}, {.scaler = ScalerConfig{.init_scale = 1024.0f}}),
        ddp(*world, opt, {.bucket_bytes = 256, .zero = zero ? 1 : 0}), x(c, B * features, memory_kind::data), y(c, B, memory_kind::data),
        stage_x(c, B * features), stage_y(c, B) {}
  void load(int step) {
    const Batch b = global_batch(2 * B, step);
    const std::int64_t first = world->rank() * B;
    std::copy_n(b.x.data() + first * features, B * features, stage_x.next().data);
    std::copy_n(b.labels.data() + first, B, stage_y.next().data);
    stage_x.upload(x.span(), x.size());
    stage_y.upload(y.span(), y.size());
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

TEST_CASE_TEMPLATE("data parallel, and with ZeRO-1: no sync, allocation or pageable copy after the first step; a "
                   "captured step replays as eager steps", P, O0Policy, O2Policy, O2BF16Policy) {
  for (const bool zero : {false, true}) {
    CAPTURE(zero);
    Context<host> ctx(1);
    StagedDdp<P> eager(ctx, zero), replayed(ctx, zero);
    eager.load(0);
    eager.step();
    const Counters first = ctx.counters();
    for (int s = 1; s < 6; ++s) {
      eager.load(s);
      eager.step();
    }
    const Counters d = ctx.counters() - first;
    test::check_no_host_work(d);
    replayed.load(0);
    CapturedStep step(ctx, [&] { replayed.step(); });
    for (int s = 1; s < 6; ++s) {
      replayed.load(s);
      step.replay();
    }
    CHECK(fingerprint(replayed.net.parameters()) == fingerprint(eager.net.parameters()));
    CHECK(same_on_every_rank(values_bits(replayed.net.parameters())));  // ZeRO-1: the masters differ by rank
    CHECK(replayed.opt.applied_steps() == 6);
  }
}

TEST_CASE("reduce_in_fp32 sums fp32 copies of bf16 gradients: closer to one process") {
  constexpr std::int64_t B = 16;
  Context<host> ctx(1);
  auto net = make_mlp<O2BF16Policy>(ctx, B, 11);
  auto ref = make_mlp<O2BF16Policy>(ctx, 2 * B, 11);
  optim::SGD<O2BF16Policy, host> opt(net.parameters(), {.lr = 0.1f});
  optim::SGD<O2BF16Policy, host> opt_ref(ref.parameters(), {.lr = 0.1f});
  parallel::DataParallel ddp(*world, opt, {.reduce_in_fp32 = true});
  CHECK(ddp.bytes_per_step() == 4 * net.parameters().template arena<nn::role::weight>().count());
  const Batch b = global_batch(2 * B, 0);
  train_on(ctx, net, opt, b, world->rank() * B, B);
  opt.step();
  train_on(ctx, ref, opt_ref, b, 0, 2 * B);
  opt_ref.step();
  CHECK(same_on_every_rank(fingerprint(net.parameters())));
  CHECK(max_abs_difference(values_of(net.parameters()), values_of(ref.parameters())) <= 2e-3);
}

TEST_CASE("explicit unscale, with and without clipping: averaged fp32 gradients, the steps of one process") {
  constexpr std::int64_t B = 16;
  Context<host> ctx(1);
  const ScalerConfig scaler{.init_scale = 1024.0f};
  for (const float clip : {0.0f, 0.05f}) {  // 0.05: a norm bound the gradients exceed, so every step clips
    auto net = make_mlp<O2Policy>(ctx, B, 13);
    auto ref = make_mlp<O2Policy>(ctx, 2 * B, 13);
    optim::SGD<O2Policy, host> opt(net.parameters(), {.lr = 0.1f, .momentum = 0.9f}, {.max_grad_norm = clip, .scaler = scaler});
    optim::SGD<O2Policy, host> opt_ref(ref.parameters(), {.lr = 0.1f, .momentum = 0.9f},
                                       {.max_grad_norm = clip, .scaler = scaler});
    parallel::DataParallel ddp(*world, opt);
    auto explicit_step = [&](auto& model, auto& o, const Batch& b, std::int64_t first, std::int64_t rows) {
      auto y = model.forward(ctx, matrix<const float>(b.x.data() + first * features, rows, features));
      auto loss = nn::cross_entropy(ctx, y, Span<const std::int32_t>(b.labels.data() + first, static_cast<std::size_t>(rows)));
      o.zero_grad();
      auto& sc = o.scaler();
      {
        auto scaled = sc.scale(loss);
        scaled.backward();
      }
      sc.unscale(o);
      sc.step(o);
      sc.update();
    };
    for (int step = 0; step < 10; ++step) {
      const Batch b = global_batch(2 * B, step);
      explicit_step(net, opt, b, world->rank() * B, B);
      explicit_step(ref, opt_ref, b, 0, 2 * B);
      REQUIRE(same_on_every_rank(fingerprint(net.parameters())));
    }
    CHECK(opt.applied_steps() == 10);
    const double gap = max_abs_difference(values_of(net.parameters()), values_of(ref.parameters()));
    if (world->rank() == 0)
      std::printf("[parallel] explicit unscale at O2, clip %g, 10 steps: max gap %.3g\n", static_cast<double>(clip), gap);
    CHECK(gap <= 1e-3);
  }
}

TEST_CASE("an inf on one rank only: every rank skips the step, backs off the scale and stays identical") {
  constexpr std::int64_t B = 8;
  Context<host> ctx(1);
  auto net = make_mlp<O2Policy>(ctx, B, 5);
  optim::SGD<O2Policy, host> opt(net.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  // No overlap: the inf goes in after backward, before the gradients are sent.
  parallel::DataParallel ddp(*world, opt, {.overlap = false});
  const Batch b = global_batch(2 * B, 0);
  train_on(ctx, net, opt, b, world->rank() * B, B);
  opt.step();
  REQUIRE(opt.applied_steps() == 1);
  const auto before = values_of(net.parameters());
  const float scale = opt.scaler().stats().scale;
  train_on(ctx, net, opt, global_batch(2 * B, 1), world->rank() * B, B);
  if (world->rank() == 1) net.parameters().template arena<nn::role::weight>().grads().data[3] = cast<half>(INFINITY);
  opt.step();
  CHECK(opt.applied_steps() == 1);
  CHECK(opt.scaler().stats().skipped == 1);
  CHECK(opt.scaler().stats().scale == scale / 2);
  CHECK(max_abs_difference(values_of(net.parameters()), before) == 0.0);
  CHECK(same_on_every_rank(fingerprint(net.parameters())));
  CHECK(same_on_every_rank(static_cast<std::int64_t>(opt.scaler().stats().scale)));
  // And training goes on, on every rank alike.
  train_on(ctx, net, opt, global_batch(2 * B, 2), world->rank() * B, B);
  opt.step();
  CHECK(opt.applied_steps() == 2);
  CHECK(same_on_every_rank(fingerprint(net.parameters())));
}

TEST_CASE("accumulation: no reduction before the last micro-batch, by accumulation_steps or by no_sync()") {
  constexpr std::int64_t B = 8;
  Context<host> ctx(1);
  auto by_option = make_mlp<O0Policy>(ctx, B, 9);
  auto by_hand = make_mlp<O0Policy>(ctx, B, 9);
  auto ref = make_mlp<O0Policy>(ctx, 2 * B, 9);
  optim::SGD<O0Policy, host> opt_option(by_option.parameters(), {.lr = 0.1f, .momentum = 0.9f}, {.accumulation_steps = 2});
  // By hand the two micro-batch means add up (no 1/2 as with accumulation_steps): half the lr is the same step.
  optim::SGD<O0Policy, host> opt_hand(by_hand.parameters(), {.lr = 0.05f, .momentum = 0.9f});
  optim::SGD<O0Policy, host> opt_ref(ref.parameters(), {.lr = 0.1f, .momentum = 0.9f}, {.accumulation_steps = 2});
  parallel::DataParallel ddp_option(*world, opt_option, {.bucket_bytes = 256});
  parallel::DataParallel ddp_hand(*world, opt_hand, {.bucket_bytes = 256});
  for (int step = 0; step < 6; ++step) {
    // Global micro-batch m has 2B rows; rank r takes rows [rB, (r+1)B) of it.
    const Batch m0 = global_batch(2 * B, 2 * step), m1 = global_batch(2 * B, 2 * step + 1);
    const std::int64_t first = world->rank() * B;
    train_on(ctx, by_option, opt_option, m0, first, B);
    opt_option.step();
    train_on(ctx, by_option, opt_option, m1, first, B);
    opt_option.step();
    {
      auto later = ddp_hand.no_sync();
      train_on(ctx, by_hand, opt_hand, m0, first, B);
    }
    train_on(ctx, by_hand, opt_hand, m1, first, B, false);
    opt_hand.step();
    train_on(ctx, ref, opt_ref, m0, 0, 2 * B);
    opt_ref.step();
    train_on(ctx, ref, opt_ref, m1, 0, 2 * B);
    opt_ref.step();
  }
  CHECK(opt_option.applied_steps() == 6);
  CHECK(ddp_option.started_in_backward() == ddp_option.buckets());
  const auto expected = values_of(ref.parameters());
  CHECK(max_abs_difference(values_of(by_option.parameters()), expected) <= 2e-6);
  CHECK(max_abs_difference(values_of(by_hand.parameters()), expected) <= 2e-6);
  CHECK(same_on_every_rank(fingerprint(by_hand.parameters())));
  CHECK(same_on_every_rank(fingerprint(by_option.parameters())));
}

TEST_CASE("a second backward after the gradients were sent, without no_sync(): a clear error, then training goes on") {
  constexpr std::int64_t B = 8;
  Context<host> ctx(1);
  auto net = make_mlp<O0Policy>(ctx, B, 9);
  optim::SGD<O0Policy, host> opt(net.parameters(), {.lr = 0.1f});
  parallel::DataParallel ddp(*world, opt, {.bucket_bytes = 256});
  const Batch b = global_batch(2 * B, 0);
  train_on(ctx, net, opt, b, world->rank() * B, B);  // learns the schedule
  opt.step();
  train_on(ctx, net, opt, b, world->rank() * B, B);  // sends every bucket during backward
  CHECK_THROWS_WITH_AS(train_on(ctx, net, opt, b, world->rank() * B, B, false),
                       doctest::Contains("wrap the earlier micro-batches' backward in no_sync()"), amp::Error);
  opt.step();  // the buckets in flight land; every rank steps alike
  CHECK(opt.applied_steps() == 2);
  CHECK(same_on_every_rank(fingerprint(net.parameters())));
}

TEST_CASE("SyncBatchNorm over 2 ranks is BatchNorm over the concatenated batch") {
  constexpr std::int64_t B = 12;
  Context<host> ctx(1);
  auto net = make_bn_net<O0Policy>(ctx, B, world);
  auto ref = make_bn_net<O0Policy>(ctx, 2 * B, nullptr);
  optim::SGD<O0Policy, host> opt(net.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  optim::SGD<O0Policy, host> opt_ref(ref.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  parallel::DataParallel ddp(*world, opt, {.bucket_bytes = 256});  // buckets in flight across the BatchNorm sums
  for (int step = 0; step < 10; ++step) {
    const Batch b = global_batch(2 * B, step);
    auto y = net.forward(ctx, matrix<const float>(b.x.data() + world->rank() * B * features, B, features));
    auto y_ref = ref.forward(ctx, matrix<const float>(b.x.data(), 2 * B, features));
    if (step == 0) {  // the same normalised activations, row for row
      const auto out = download(ctx, Span<const float>(y.var.span()));
      const auto out_ref = download(ctx, Span<const float>(y_ref.var.span()));
      const std::vector<float> mine(out_ref.begin() + world->rank() * B * classes,
                                    out_ref.begin() + (world->rank() + 1) * B * classes);
      CHECK(max_abs_difference(out, mine) <= 1e-6);
    }
    auto loss = nn::cross_entropy(ctx, y, Span<const std::int32_t>(b.labels.data() + world->rank() * B, B));
    auto loss_ref = nn::cross_entropy(ctx, y_ref, Span<const std::int32_t>(b.labels.data(), 2 * B));
    opt.zero_grad();
    {
      auto scaled = scale_loss(loss, opt);
      scaled.backward();
    }
    opt.step();
    opt_ref.zero_grad();
    {
      auto scaled = scale_loss(loss_ref, opt_ref);
      scaled.backward();
    }
    opt_ref.step();
  }
  CHECK(ddp.started_in_backward() == ddp.buckets());
  // Weights, BatchNorm's scale and shift, and its running statistics.
  CHECK(max_abs_difference(values_of(net.parameters()), values_of(ref.parameters())) <= 1e-5);
  CHECK(same_on_every_rank(fingerprint(net.parameters())));
  // Evaluation uses the running statistics: no collective, the same answers.
  net.eval(), ref.eval();
  const Batch b = global_batch(B, 99);
  const auto e = download(ctx, Span<const float>(net.forward(ctx, matrix<const float>(b.x.data(), B, features)).var.span()));
  const auto e_ref = download(ctx, Span<const float>(ref.forward(ctx, matrix<const float>(b.x.data(), B, features)).var.span()));
  CHECK(max_abs_difference(e, e_ref) <= 1e-5);
}

TEST_CASE("ranks that build different models: a clear error on every rank, not a hang") {
  Context<host> ctx(1);
  auto net = make_mlp<O0Policy>(ctx, 8, 1, world->rank() == 0 ? 32 : 24);
  optim::SGD<O0Policy, host> opt(net.parameters(), {.lr = 0.1f});
  CHECK_THROWS_WITH_AS(parallel::DataParallel(*world, opt), doctest::Contains("the ranks hold different models"),
                       amp::Error);
}

TEST_CASE("the distributed sampler: disjoint shards of one permutation, together one process's batch") {
  data::LabelledImages set{.count = 11, .rows = 1, .cols = 1, .pixels = {}, .labels = {}};
  for (int i = 0; i < 11; ++i) set.pixels.push_back(static_cast<std::uint8_t>(i)), set.labels.push_back(i % 10);
  Context<host> ctx(1);
  data::Loader<float, host> one(ctx, set, {.batch_size = 4, .seed = 3});
  data::Loader<float, host> r0(ctx, set, {.batch_size = 2, .seed = 3, .rank = 0, .ranks = 2});
  data::Loader<float, host> r1(ctx, set, {.batch_size = 2, .seed = 3, .rank = 1, .ranks = 2});
  REQUIRE(one.batches() == 3);
  REQUIRE(r0.batches() == 3);
  REQUIRE(r1.batches() == 3);
  for (int epoch = 0; epoch < 2; ++epoch) {
    one.start_epoch(), r0.start_epoch(), r1.start_epoch();
    std::vector<int> seen;
    for (std::int64_t b = 0; b < 3; ++b) {
      auto pixels = [](auto batch) {
        std::vector<int> v;
        for (std::int64_t i = 0; i < batch.x.shape[0]; ++i) v.push_back(static_cast<int>(std::lround(batch.x.data[i] * 255)));
        return v;
      };
      const auto a = pixels(r0.batch(b)), c = pixels(r1.batch(b)), whole = pixels(one.batch(b));
      std::vector<int> joined = a;
      joined.insert(joined.end(), c.begin(), c.end());
      CHECK(joined == whole);
      if (b == 2) CHECK((a.size() == 2 && c.size() == 1));  // 3 left: the first rank takes one more
      seen.insert(seen.end(), joined.begin(), joined.end());
    }
    std::sort(seen.begin(), seen.end());
    for (int i = 0; i < 11; ++i) CHECK(seen[static_cast<std::size_t>(i)] == i);  // each sample once per epoch
  }
  using Loader = data::Loader<float, host>;
  CHECK_THROWS_WITH_AS(Loader(ctx, set, {.rank = 2, .ranks = 2}), "Loader: rank 2 of 2 ranks", amp::Error);
}

int main(int argc, char** argv) {
  parallel::MpiEnvironment mpi(argc, argv);
  int failed = 0;
  {
    parallel::MpiCommunicator comm;
    amp::test::world = &comm;
    doctest::Context tests(argc, argv);
    if (comm.rank() != 0) tests.setOption("out", "/dev/null");  // one report; a failure still fails the job
    failed = tests.run();
    // Every rank learns whether any failed, and says so.
    const auto all = comm.all_gather(failed);
    for (std::size_t r = 0; r < all.size(); ++r)
      if (all[r] && comm.rank() == 0) std::printf("[parallel] rank %zu failed its cases\n", r);
    failed = 0;
    for (auto f : all) failed |= f != 0;
    amp::test::world = nullptr;
  }
  return failed;
}
