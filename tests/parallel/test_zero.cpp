// ZeRO stage 1 on the host over MPI, run as 2 ranks (in amp_parallel_tests):
// each rank keeps the masters and optimizer state of its shard. Every case
// trains a sharded run beside an unsharded data-parallel run of the same
// model and batches, and compares them.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

#include "amp/io/checkpoint.hpp"
#include "parallel/harness.hpp"

using namespace amp;
using namespace amp::test;

namespace {
constexpr std::int64_t hidden = 80;

// A norm role too (LayerNorm), so both roles' arenas are sharded.
template <Policy P>
using LnNet = nn::Sequential<P, host, nn::Linear, nn::LayerNorm, nn::ReLU, nn::Linear>;
template <Policy P>
LnNet<P> make_ln_net(Context<host>& ctx, std::int64_t max_batch, nn::Shard shard = {}) {
  return LnNet<P>(ctx, {.max_batch = max_batch, .seed = 21, .shard = shard},
                  {.in_features = features, .out_features = hidden}, {.features = hidden}, {},
                  {.in_features = hidden, .out_features = classes});
}
nn::Shard this_rank(bool whole_tensors = false) { return {world->rank(), world->size(), whole_tensors}; }

// AdamW as the examples train: no decay on biases and norms, clipping by the
// global norm (0.05: every step clips, so the combined norm is used).
template <Policy P>
optim::AdamW<P, host> make_adamw(nn::ParameterStore<P, host>& store, float clip = 0.05f) {
  return optim::AdamW<P, host>(store, {.lr = 0.01f, .weight_decay = 0.1f},
                               {.max_grad_norm = clip,
                                .groups = {{.select = optim::select::no_decay, .lr = {}, .weight_decay = 0.0f}},
                                .scaler = ScalerConfig{.init_scale = 1024.0f}});
}

// A sharded run and an unsharded one of the same net and AdamW, each on its
// own context, under data parallel with `options` (and zero = 1 for the first).
template <Policy P>
struct Twins {
  Context<host> zctx{1}, dctx{1};
  LnNet<P> zero, plain;
  optim::AdamW<P, host> zopt, dopt;
  parallel::DataParallel<optim::AdamW<P, host>> zddp, dddp;
  Twins(std::int64_t max_batch, float clip, parallel::DataParallelOptions options)
      : zero(make_ln_net<P>(zctx, max_batch, this_rank())), plain(make_ln_net<P>(dctx, max_batch)),
        zopt(make_adamw(zero.parameters(), clip)), dopt(make_adamw(plain.parameters(), clip)),
        zddp(*world, zopt, with_zero(options)), dddp(*world, dopt, options) {}
  static parallel::DataParallelOptions with_zero(parallel::DataParallelOptions o) {
    o.zero = 1;
    return o;
  }
};

// The stored values of both roles, widened.
template <class Store>
std::vector<float> stored(Store& s) {
  std::vector<float> out;
  auto add = [&](auto span) {
    for (std::size_t i = 0; i < span.size; ++i) out.push_back(cast<float>(span.data[i]));
  };
  add(s.template arena<nn::role::weight>().values());
  add(s.template arena<nn::role::norm>().values());
  return out;
}

// A sharded buffer (masters, a moment) against the same elements of a whole one.
std::vector<float> slice(Context<host>& ctx, Span<float> whole, std::size_t begin, std::size_t count) {
  return download(ctx, Span<const float>(whole.subspan(begin, count)));
}
}  // namespace

TEST_CASE("ZeRO-1: even shards through tensors, or at tensor starts; masters and state of the shard only") {
  Context<host> ctx(1);
  auto whole = make_ln_net<O2Policy>(ctx, 8);
  for (const bool whole_tensors : {false, true}) {
    auto net = make_ln_net<O2Policy>(ctx, 8, this_rank(whole_tensors));
    auto& store = net.parameters();
    const auto& wb = store.shard_bounds<nn::role::weight>();
    const auto& nb = store.shard_bounds<nn::role::norm>();
    REQUIRE(wb.size() == 3);
    REQUIRE(nb.size() == 3);
    // Weights: Linear 8x80 (640) and its bias (80 -> 128), Linear 80x3 (240 -> 256) and its bias (3 -> 128): 9
    // blocks of 128. Evenly: 4 blocks | 5, through the first weight; whole tensors: at the first bias (640).
    CHECK(wb[0] == 0);
    CHECK(wb[1] == (whole_tensors ? 640 : 512));
    CHECK(wb[2] == store.arena<nn::role::weight>().count());
    CHECK(nb[1] == 128);  // LayerNorm's weight | bias
    const auto& first = store.table()[0];
    CHECK(store.part(first, 0).size() == (whole_tensors ? 640u : 512u));
    CHECK(store.part(first, 1).size() == (whole_tensors ? 0u : 128u));
    auto& a = store.arena<nn::role::weight>();
    CHECK(a.master().size == a.shard_count());
    CHECK(a.shard_begin() == wb[static_cast<std::size_t>(world->rank())]);
    // Each rank's masters are the fp32 initial values of its shard.
    const auto& whole_w = whole.parameters().arena<nn::role::weight>();
    CHECK(download(ctx, Span<const float>(a.master())) == slice(ctx, whole_w.master(), a.shard_begin(), a.shard_count()));
    // get_values: the masters of this rank's part, the stored values widened elsewhere.
    for (std::size_t i = 0; i < store.table().size(); ++i) {
      const auto& p = store.table()[i];
      if (p.kind == nn::role::buffer) continue;
      const auto mine = store.get_values(static_cast<int>(i)), ref = whole.parameters().get_values(static_cast<int>(i));
      const nn::Part q = store.part(p);
      for (std::size_t k = 0; k < mine.size(); ++k)
        CHECK(mine[k] == (k >= q.begin && k < q.end ? ref[k] : cast<float>(cast<half>(ref[k]))));
    }
  }
}

// 50 steps of AdamW with clipping and a no-decay group; at step 20 rank 1
// writes an inf into a gradient of rank 0's shard after backward: only rank
// 0's shard sees it after the reduction, and both ranks must skip.
TEST_CASE_TEMPLATE("ZeRO-1 on 2 ranks steps as 2 ranks without it: 50 steps, an overflow in one shard skips both",
                   P, O0Policy, O2BF16Policy, O2Policy) {
  constexpr std::int64_t B = 16;
  constexpr int steps = 50, bad_step = 20;
  // No overlap: the inf goes in after backward, before the gradients are sent.
  Twins<P> t(B, 0.05f, {.bucket_bytes = 256, .overlap = false});
  auto &zero = t.zero, &plain = t.plain;
  auto &zopt = t.zopt, &dopt = t.dopt;
  auto &zctx = t.zctx, &dctx = t.dctx;
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    const Batch b = global_batch(2 * B, step);
    train_on(zctx, zero, zopt, b, world->rank() * B, B);
    train_on(dctx, plain, dopt, b, world->rank() * B, B);
    if (step == bad_step && world->rank() == 1) {
      using G = typename P::grad_type;
      zero.parameters().template arena<nn::role::weight>().grads().data[5] = cast<G>(INFINITY);  // rank 0's shard
      plain.parameters().template arena<nn::role::weight>().grads().data[5] = cast<G>(INFINITY);
    }
    zopt.step();
    dopt.step();
    REQUIRE(same_on_every_rank(values_bits(zero.parameters())));
    worst = std::max(worst, max_abs_difference(stored(zero.parameters()), stored(plain.parameters())));
  }
  CHECK(zopt.applied_steps() == steps - 1);
  CHECK(dopt.applied_steps() == steps - 1);
  CHECK(zopt.scaler().stats().skipped == 1);
  CHECK(zopt.last_stats().sumsq == doctest::Approx(dopt.last_stats().sumsq).epsilon(1e-12));
  // The same values, masters and moments, bit for bit: a reduce and an
  // all-reduce add the 2 ranks' gradients alike, and the norm summed over the
  // shards (fp64) rounds to the same fp32 clip factor as the whole arena's.
  if (world->rank() == 0) std::printf("[zero] %s: 50 steps, max |sharded - unsharded| %.3g\n", std::string(P::name).c_str(), worst);
  CHECK(worst == 0.0);
  CHECK(values_bits(zero.parameters()) == values_bits(plain.parameters()));
  auto& za = zero.parameters().template arena<nn::role::weight>();
  auto& da = plain.parameters().template arena<nn::role::weight>();
  if constexpr (!std::is_same_v<P, O0Policy>)
    CHECK(download(zctx, Span<const float>(za.master())) == slice(dctx, da.master(), za.shard_begin(), za.shard_count()));
  for (int k = 0; k < 2; ++k)
    CHECK(download(zctx, Span<const float>(zopt.template state_buffer<nn::role::weight>(k))) ==
          slice(dctx, dopt.template state_buffer<nn::role::weight>(k), za.shard_begin(), za.shard_count()));
  // Per rank: the masters and the optimizer state of about half the parameters.
  const auto kept = [](Context<host>& c) {
    return static_cast<double>(c.memory().peak(memory_kind::master) + c.memory().peak(memory_kind::optimizer));
  };
  const double ratio = kept(zctx) / kept(dctx);
  if (world->rank() == 0) std::printf("[zero] %s: master + optimizer per rank %.3fx of unsharded\n", std::string(P::name).c_str(), ratio);
  CHECK(ratio <= 0.65);  // a small net (1,408 elements): the optimizer's few fixed buffers weigh in
}

TEST_CASE("ZeRO-1 with buckets sent during backward and explicit unscale: the steps of data parallel") {
  constexpr std::int64_t B = 16;
  Twins<O2Policy> t(B, 0.0f, {.bucket_bytes = 256});
  auto &zero = t.zero, &plain = t.plain;
  auto &zopt = t.zopt, &dopt = t.dopt;
  auto &zctx = t.zctx, &dctx = t.dctx;
  // Halved after unscaling: the first parameter of each rank's shard (each rank edits what it holds).
  std::vector<int> edited;
  for (int r = 0; r < world->size(); ++r)
    for (std::size_t i = 0; i < zero.parameters().table().size(); ++i) {
      const auto& p = zero.parameters().table()[i];
      if (p.kind != nn::role::buffer && zero.parameters().part(p, r).size() == p.count) {
        edited.push_back(static_cast<int>(i));
        break;
      }
    }
  REQUIRE(edited.size() == 2);
  for (int step = 0; step < 10; ++step) {
    const Batch b = global_batch(2 * B, step);
    auto explicit_step = [&](auto& model, auto& o, Context<host>& c, bool sharded) {
      auto y = model.forward(c, matrix<const float>(b.x.data() + world->rank() * B * features, B, features));
      auto loss = nn::cross_entropy(c, y, Span<const std::int32_t>(b.labels.data() + world->rank() * B, B));
      o.zero_grad();
      auto& sc = o.scaler();
      {
        auto scaled = sc.scale(loss);
        scaled.backward();
      }
      sc.unscale(o);
      for (int i : edited) {
        if (sharded && !model.parameters().owns(model.parameters().table()[static_cast<std::size_t>(i)])) continue;
        auto g = o.gradients().unscaled(model.parameters(), i);
        for (std::size_t k = 0; k < g.size; ++k) g.data[k] *= 0.5f;
      }
      sc.step(o);
      sc.update();
    };
    explicit_step(zero, zopt, zctx, true);
    explicit_step(plain, dopt, dctx, false);
    if (step > 0) CHECK(t.zddp.started_in_backward() == t.zddp.buckets());
  }
  CHECK(zopt.applied_steps() == 10);
  CHECK(values_bits(zero.parameters()) == values_bits(plain.parameters()));
  // Another rank's parameter: its summed gradient is not here.
  for (std::size_t i = 0; i < zero.parameters().table().size(); ++i) {
    const auto& p = zero.parameters().table()[i];
    if (p.kind == nn::role::buffer || zero.parameters().owns(p)) continue;
    const Batch b = global_batch(2 * B, 99);
    train_on(zctx, zero, zopt, b, world->rank() * B, B);
    zopt.scaler().unscale(zopt);
    CHECK_THROWS_WITH_AS(zopt.gradients().unscaled(zero.parameters(), static_cast<int>(i)),
                         doctest::Contains("is not all in this rank's shard (ZeRO-1)"), amp::Error);
    zopt.scaler().step(zopt);
    zopt.scaler().update();
    break;
  }
  CHECK(same_on_every_rank(values_bits(zero.parameters())));
}

TEST_CASE_TEMPLATE("ZeRO-1 checkpoints: resume on 2 ranks bit for bit; load into one process", P, O0Policy, O2Policy) {
  constexpr std::int64_t B = 8;
  // One name for the job: rank 0's process id.
  const std::string path = "/tmp/amp_zero_" + std::to_string(world->all_gather(getpid())[0]) + ".ckpt";
  Context<host> ctx(1), rctx(1), dctx(1);
  auto zero = make_ln_net<P>(ctx, B, this_rank());
  auto plain = make_ln_net<P>(dctx, B);
  auto zopt = make_adamw(zero.parameters());
  auto dopt = make_adamw(plain.parameters());
  parallel::DataParallel zddp(*world, zopt, {.zero = 1});
  parallel::DataParallel dddp(*world, dopt);
  auto run = [&](auto& net, auto& opt, Context<host>& c, int from, int to) {
    for (int step = from; step < to; ++step) {
      train_on(c, net, opt, global_batch(2 * B, step), world->rank() * B, B);
      opt.step();
    }
  };
  run(zero, zopt, ctx, 0, 6);
  run(plain, dopt, dctx, 0, 6);
  io::save(path, zero, zopt);  // every rank: the shards gather on rank 0, which writes
  run(zero, zopt, ctx, 6, 12);

  // A fresh sharded run from the file takes the same 6 steps.
  auto resumed = make_ln_net<P>(rctx, B, this_rank());
  auto ropt = make_adamw(resumed.parameters());
  parallel::DataParallel rddp(*world, ropt, {.zero = 1});
  io::load(path, resumed, ropt);
  run(resumed, ropt, rctx, 6, 12);
  CHECK(values_bits(resumed.parameters()) == values_bits(zero.parameters()));
  auto& ra = resumed.parameters().template arena<nn::role::weight>();
  auto& za = zero.parameters().template arena<nn::role::weight>();
  CHECK(download(rctx, Span<const float>(ra.master())) == download(ctx, Span<const float>(za.master())));
  CHECK(download(rctx, Span<const float>(ropt.template state_buffer<nn::role::weight>(1))) ==
        download(ctx, Span<const float>(zopt.template state_buffer<nn::role::weight>(1))));
  CHECK(ropt.applied_steps() == 12);

  // One process loads the gathered file: every master and moment of the unsharded run at step 6.
  if (world->rank() == 0) {
    Context<host> one(1);
    auto single = make_ln_net<P>(one, B);
    auto sopt = make_adamw(single.parameters());
    io::load(path, single, sopt);
    CHECK(values_of(single.parameters()) == values_of(plain.parameters()));
    for (int k = 0; k < 2; ++k)
      CHECK(download(one, Span<const float>(sopt.template state_buffer<nn::role::weight>(k))) ==
            download(dctx, Span<const float>(dopt.template state_buffer<nn::role::weight>(k))));
    CHECK(sopt.applied_steps() == 6);
    std::remove(path.c_str());
  }
}

TEST_CASE("ZeRO-1's misuses: clear errors") {
  Context<host> ctx(1);
  {
    auto net = make_ln_net<O2Policy>(ctx, 8);
    auto opt = make_adamw(net.parameters());
    CHECK_THROWS_WITH_AS(parallel::DataParallel(*world, opt, {.zero = 1}),
                         doctest::Contains("build the model with .shard = {"), amp::Error);
    CHECK_THROWS_WITH_AS(parallel::DataParallel(*world, opt, {.zero = 2}), doctest::Contains("zero must be 0 or 1"),
                         amp::Error);
  }
  auto net = make_ln_net<O2Policy>(ctx, 8, this_rank());
  auto opt = make_adamw(net.parameters());
  CHECK_THROWS_WITH_AS(parallel::DataParallel(*world, opt), doctest::Contains("construct DataParallel with zero = 1"),
                       amp::Error);
  // Stepping a sharded model without ZeRO's data parallel: refused, nothing changes.
  const auto before = values_bits(net.parameters());
  train_on(ctx, net, opt, global_batch(16, 0), world->rank() * 8, 8);
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("train it under parallel::DataParallel with zero = 1"), amp::Error);
  CHECK(values_bits(net.parameters()) == before);
  // Saving it needs the ranks' communicator to gather the shards: refused, no file written.
  const std::string path = "/tmp/amp_zero_unsaved_" + std::to_string(world->all_gather(getpid())[0]) + ".ckpt";
  CHECK_THROWS_WITH_AS(io::save(path, net, opt), doctest::Contains("save it while its DataParallel (zero = 1) lives"),
                       amp::Error);
  CHECK_FALSE(std::ifstream(path).good());
  using AdamW = optim::AdamW<O2Policy, host>;
  CHECK_THROWS_WITH_AS(AdamW(net.parameters(), {}, {.per_tensor_norms = true}),
                       doctest::Contains("per_tensor_norms is not available under ZeRO-1"), amp::Error);
  // Ranks that start from other values (another seed): no rank could send them all the masters.
  Context<host> other(1);
  auto seeded = LnNet<O2Policy>(other, {.max_batch = 8, .seed = 30u + static_cast<std::uint64_t>(world->rank()),
                                        .shard = this_rank()},
                                {.in_features = features, .out_features = hidden}, {.features = hidden}, {},
                                {.in_features = hidden, .out_features = classes});
  auto sopt = make_adamw(seeded.parameters());
  CHECK_THROWS_WITH_AS(parallel::DataParallel(*world, sopt, {.zero = 1}),
                       doctest::Contains("starts from other parameter values than rank 0"), amp::Error);
  using Store = nn::ParameterStore<O2Policy, host>;
  Store s(ctx);
  CHECK_THROWS_WITH_AS(s.allocate({.rank = 2, .ranks = 2}), doctest::Contains("shard 2 of 2 ranks does not exist"),
                       amp::Error);
}

TEST_CASE("ZeRO-1 with LAMB: per-tensor trust ratios on whole-tensor shards, the steps of data parallel") {
  constexpr std::int64_t B = 16;
  Context<host> zctx(1), dctx(1);
  using Lamb = optim::LAMB<O2BF16Policy, host>;
  {
    auto split = make_ln_net<O2BF16Policy>(zctx, B, this_rank());
    CHECK_THROWS_WITH_AS(Lamb(split.parameters(), {.lr = 0.01f}), doctest::Contains("is split between ZeRO-1 shards"),
                         amp::Error);
  }
  auto zero = make_ln_net<O2BF16Policy>(zctx, B, this_rank(true));
  auto plain = make_ln_net<O2BF16Policy>(dctx, B);
  Lamb zopt(zero.parameters(), {.lr = 0.01f});
  Lamb dopt(plain.parameters(), {.lr = 0.01f});
  parallel::DataParallel zddp(*world, zopt, {.bucket_bytes = 256, .zero = 1});
  parallel::DataParallel dddp(*world, dopt, {.bucket_bytes = 256});
  for (int step = 0; step < 10; ++step) {
    const Batch b = global_batch(2 * B, step);
    train_on(zctx, zero, zopt, b, world->rank() * B, B);
    zopt.step();
    train_on(dctx, plain, dopt, b, world->rank() * B, B);
    dopt.step();
  }
  CHECK(zopt.applied_steps() == 10);
  CHECK(values_bits(zero.parameters()) == values_bits(plain.parameters()));
  CHECK(same_on_every_rank(values_bits(zero.parameters())));
}

// Apex's num_losses: two losses, each with its own scaler, unscaled into one
// step. The second backward must start from zeroed gradients on every rank,
// also outside the rank's shard (what it sends to the others).
TEST_CASE("ZeRO-1 with two losses and two scalers on one optimizer: the steps of data parallel") {
  constexpr std::int64_t B = 8;
  Twins<O2Policy> t(B, 0.0f, {.bucket_bytes = 256});
  auto &zero = t.zero, &plain = t.plain;
  auto &zopt = t.zopt, &dopt = t.dopt;
  auto &zctx = t.zctx, &dctx = t.dctx;
  DynamicLossScaler<host> z0(zctx, {.init_scale = 1024.0f}), z1(zctx, {.init_scale = 8.0f});
  DynamicLossScaler<host> d0(dctx, {.init_scale = 1024.0f}), d1(dctx, {.init_scale = 8.0f});
  auto iteration = [&](auto& net, auto& opt, Context<host>& c, DynamicLossScaler<host>& s0, DynamicLossScaler<host>& s1,
                       int step) {
    opt.zero_grad();
    for (int k = 0; k < 2; ++k) {
      const Batch b = global_batch(2 * B, 2 * step + k);
      auto y = net.forward(c, matrix<const float>(b.x.data() + world->rank() * B * features, B, features));
      auto loss = nn::cross_entropy(c, y, Span<const std::int32_t>(b.labels.data() + world->rank() * B, B));
      auto& s = k == 0 ? s0 : s1;
      {
        auto scaled = s.scale(loss);
        scaled.backward();
      }
      s.unscale(opt);
    }
    s0.step(opt);
    s0.update();
    s1.update();
  };
  for (int step = 0; step < 6; ++step) {
    iteration(zero, zopt, zctx, z0, z1, step);
    iteration(plain, dopt, dctx, d0, d1, step);
    REQUIRE(values_bits(zero.parameters()) == values_bits(plain.parameters()));
  }
  CHECK(zopt.applied_steps() == 6);
}
