// The graph-ready step, proven on the CPU: after the first step nothing syncs,
// allocates, frees or copies from pageable memory, at every level and with
// every feature (the counters sit where shared code decides, so the GPU's are
// the same); a CapturedStep replays as eager steps; and what a CUDA graph
// cannot hold is refused with an error naming it.
#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "amp/amp.hpp"
#include "support/policies.hpp"
#include "support/no_host_work.hpp"
#include "support/param_fixture.hpp"
#include "support/step_recipe.hpp"

using namespace amp;
using namespace amp::test;

TEST_CASE("counters: each decision point counts where the GPU would sync, allocate or copy") {
  Context<host> ctx;
  const Counters start = ctx.counters();
  Buffer<float, host> b(ctx, 16, memory_kind::workspace);
  PinnedBuffer<float, host> pinned(ctx, 16);
  const std::vector<float> pageable(16, 1.0f);
  std::fill_n(pinned.data(), 16, 1.0f);
  upload(ctx, b.span(), pinned, 16);         // pinned: asynchronous, not counted
  upload(ctx, b.span(), pageable);           // pageable: 1 copy
  const auto back = download(ctx, Span<const float>(b.span()));  // a copy and a sync
  ctx.scratch<float>(scratch_slot::reduction, 1000);  // growth: sync, allocation
  ctx.scratch<float>(scratch_slot::reduction, 10);    // fits: nothing
  fill(ctx, b.span(), 0.0f);                          // one launch
  const Counters d = ctx.counters() - start;
  CHECK(back == pageable);
  CHECK(d.allocations == 3);
  CHECK(d.frees == 0);
  CHECK(d.pageable_copies == 2);
  CHECK(d.syncs == 2);
  CHECK(d.launches == 1);
}

TEST_CASE_TEMPLATE("steady state: no sync, allocation, free or pageable copy after the first step, every feature", P,
                   O0Policy, O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy, AllFp8Policy, CurrentFp8Policy) {
  for (const bool accumulate : {false, true}) {
    CAPTURE(accumulate);
    Context<host> ctx;
    StepRecipe<P, host> r(ctx, {.accumulate = accumulate, .overflow_at = 4});
    r.load(0);
    r.step();
    const Counters first = ctx.counters();
    r.load(1);
    r.step();
    const std::size_t launches = (ctx.counters() - first).launches;
    for (int s = 2; s < 8; ++s) {  // step 4 overflows: a skipped step does no host work either
      r.load(s);
      r.step();
    }
    const Counters d = ctx.counters() - first;
    test::check_no_host_work(d);
    CHECK(launches > 20);
    CHECK(d.launches == 7 * launches);  // the same work every step
    const ScalerStats sc = (accumulate ? r.opt_net.scaler() : r.scaler).stats();
    CHECK(sc.skipped == 1);
  }
}

TEST_CASE_TEMPLATE("a captured step replays as eager steps, bit for bit, through an injected overflow", P, O0Policy,
                   O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy, AllFp8Policy, CurrentFp8Policy) {
  for (const bool accumulate : {false, true}) {
    CAPTURE(accumulate);
    Context<host> ctx;
    const typename StepRecipe<P, host>::Options o{.accumulate = accumulate, .overflow_at = 5};
    StepRecipe<P, host> eager(ctx, o), replayed(ctx, o);
    constexpr int steps = 12;
    for (int s = 0; s < steps; ++s) {
      eager.load(s);
      eager.step();
    }
    replayed.load(0);
    CapturedStep step(ctx, [&] { replayed.step(); });  // step 0: the warm-up
    for (int s = 1; s < steps; ++s) {
      replayed.load(s);
      step.replay();
    }
    CHECK(step.replays() == steps - 1);
    CHECK(step.launches_per_step() > 20);
    const auto a = eager.snapshot(), b = replayed.snapshot();
    REQUIRE(a.size() == b.size());
    CHECK(a == b);
    CHECK(replayed.opt_net.applied_steps() == steps - 1);  // the overflow skipped one
    CHECK(replayed.opt_net.steps() == steps);
  }
}

TEST_CASE_TEMPLATE("eager work between replays sees the replayed weights (O1's cast cache)", P, O1Policy, O1BF16Policy) {
  Context<host> ctx;
  StepRecipe<P, host> eager(ctx, {}), replayed(ctx, {});
  const auto evaluate = [&](StepRecipe<P, host>& r) {
    r.net.eval();
    const auto out = r.net.forward(ctx, r.input(0));
    r.net.train();
    return download(ctx, Span<const typename P::activation_type>(out.value().span()));
  };
  eager.load(0);
  eager.step();
  replayed.load(0);
  CapturedStep step(ctx, [&] { replayed.step(); });
  for (int s = 1; s < 4; ++s) {
    eager.load(s);
    eager.step();
    replayed.load(s);
    step.replay();
    const auto a = evaluate(eager), b = evaluate(replayed);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(detail::bits(a[i]) == detail::bits(b[i]));
  }
}

TEST_CASE("rates set between replays reach the replayed step: set_lr, a schedule, a new table") {
  Context<host> ctx;
  ParamFixture<O0Policy, host> f(ctx, {0.0f});
  optim::SGD<O0Policy, host> opt(*f.params, {.lr = 1.0f});
  // Each step's gradient is 1, written on the device (a step needs new gradients): it subtracts its rate.
  CapturedStep step(ctx, [&] {
    fill(ctx, f.params->grads(f.w), 1.0f);
    opt.step();
  });                                            // step 0, rate 1
  step.replay();                                 // step 1, rate 1
  opt.set_lr(0.5f);
  step.replay();                                 // step 2, 0.5
  opt.set_schedule([](std::int64_t t) { return 0.125f * static_cast<float>(t); }, 4);
  step.replay();                                 // step 3, 0.375
  opt.set_schedule([](std::int64_t t) { return 0.0625f * static_cast<float>(t); }, 16);  // a longer table moves
  step.replay();                                 // step 4, 0.25
  step.replay();                                 // step 5, 0.3125
  CHECK(f.values()[0] == -(1.0f + 1.0f + 0.5f + 0.375f + 0.25f + 0.3125f));
  CHECK(opt.steps() == 6);
}

TEST_CASE("a captured step refuses what a CUDA graph cannot hold, and leaves the context usable") {
  Context<host> ctx;
  StepRecipe<O2Policy, host> r(ctx, {});
  r.load(0);
  const auto refused = [&](auto&& extra, const char* why) {
    CHECK_THROWS_WITH_AS(CapturedStep(ctx, [&] {
                           r.step();
                           extra();
                         }).replay(),
                         doctest::Contains(why), Error);
    CHECK_FALSE(ctx.capturing());
  };
  refused([&] { (void)r.opt_net.last_stats(); }, "bytes to the host (a host sync)");
  refused([&] { r.opt_net.set_lr(0.5f); }, "from pageable host memory");
  refused([&] { Buffer<float, host> grown(ctx, 4, memory_kind::workspace); }, "allocates 16 bytes of workspace");
  refused([&] { ctx.synchronize(); }, "waits for the stream");
  CHECK_THROWS_WITH_AS(CapturedStep(ctx, [&] { r.step(); }, {.warmup = 0}), doctest::Contains("warmup must be >= 1"),
                       Error);
  CHECK_THROWS_WITH_AS(CapturedStep(ctx,
                                    [&] {
                                      r.step();
                                      if (ctx.capturing()) CapturedStep inner(ctx, [] {});
                                    }),
                       doctest::Contains("already capturing"), Error);
  CHECK_FALSE(ctx.capturing());
  {
    const std::size_t without = ctx.memory().current(memory_kind::workspace);
    std::optional<Buffer<float, host>> held(std::in_place, ctx, 4, memory_kind::workspace);
    const std::size_t with = ctx.memory().current(memory_kind::workspace);
    CHECK(with == without + 16);
    CHECK_THROWS_WITH_AS(CapturedStep(ctx,
                                      [&] {
                                        r.step();
                                        if (!ctx.capturing()) return;
                                        held.reset();  // freed only while recording: held until the capture ends
                                        CHECK(ctx.memory().current(memory_kind::workspace) == with);
                                      }),
                         doctest::Contains("freed 1 buffers"), Error);
    CHECK_FALSE(ctx.capturing());
    CHECK(ctx.memory().current(memory_kind::workspace) == without);  // released once the capture was refused
  }
  // Eager steps still run, and a capture after the failed ones replays.
  const Counters before = ctx.counters();
  r.step();
  CapturedStep step(ctx, [&] { r.step(); });
  step.replay();
  CHECK((ctx.counters() - before).syncs == 0);
  // Eager work that grows the scratch past the capture's moves it: the graph would read freed memory.
  (void)ctx.scratch<float>(scratch_slot::reduction, std::size_t{1} << 20);
  CHECK_THROWS_WITH_AS(step.replay(), doctest::Contains("scratch memory moved after the capture"), Error);
}
