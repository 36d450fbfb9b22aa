// CUDA twins of the graph-ready step (tests/host/test_capture.cpp). On the GPU
// a CapturedStep is one CUDA graph: replays must equal eager steps bit for bit
// at every level through an injected overflow, the steady state must count no
// sync, allocation or pageable copy, a graph must refuse what it cannot hold,
// and the plans (cuBLASLt, CUB's temporary storage) are made once.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <limits>
#include <optional>
#include <vector>

#include "amp/amp.hpp"
#include "amp/data/loader.hpp"
#include "cuda/twins.hpp"
#include "support/gpu.cuh"
#include "support/no_host_work.hpp"
#include "support/policies.hpp"
#include "support/step_recipe.hpp"

using namespace amp;
using namespace amp::test;

namespace {
// Keeps the stream busy for about `cycles` clock ticks, so queries find work in flight.
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
}  // namespace

TEST_CASE("cuda: a query of work in flight answers 'not ready' and leaves no error for the next launch") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  Buffer<int, amp::cuda> value(ctx, 1, memory_kind::workspace);
  fill(ctx, value.span(), 7);
  Mirror<int, amp::cuda> mirror(ctx);
  spin<<<1, 1, 0, ctx.stream()>>>(200'000'000);  // ~0.1 s at H100 clocks
  AMP_CUDA_CHECK(cudaGetLastError());
  CHECK_FALSE(detail::cuda_ready(cudaStreamQuery(ctx.stream()), "cudaStreamQuery"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  mirror.refresh(ctx, value.data());  // its copy queues behind the spin
  mirror.refresh(ctx, value.data());  // its event is not ready: the copy in flight is kept
  CHECK(mirror.latest() == nullptr);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK_NOTHROW(fill(ctx, value.span(), 8));  // a launch whose check would read a stale "not ready"
  ctx.synchronize();
  mirror.refresh(ctx, value.data());
  REQUIRE(mirror.latest() != nullptr);
  CHECK(*mirror.latest() == 7);
}

TEST_CASE_TEMPLATE("cuda: 50 replays of a captured step equal 50 eager steps bit for bit, through an injected overflow",
                   P, O0Policy, O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  AMP_REQUIRE_GPU();
  for (const bool accumulate : {false, true}) {
    CAPTURE(accumulate);
    Context<amp::cuda> ctx;
    const typename StepRecipe<P, amp::cuda>::Options o{.accumulate = accumulate, .overflow_at = 17};
    StepRecipe<P, amp::cuda> eager(ctx, o), replayed(ctx, o);
    constexpr int steps = 51;  // one warm-up, then 50 replays
    for (int s = 0; s < steps; ++s) {
      eager.load(s);
      eager.step();
    }
    replayed.load(0);
    CapturedStep step(ctx, [&] { replayed.step(); });
    for (int s = 1; s < steps; ++s) {
      replayed.load(s);
      step.replay();
    }
    CHECK(step.graph_nodes() >= step.launches_per_step());
    const auto a = eager.snapshot(), b = replayed.snapshot();
    REQUIRE(a.size() == b.size());
    CHECK(a == b);
    CHECK(replayed.opt_net.steps() == steps);
    CHECK(replayed.opt_net.applied_steps() == steps - 1);  // the injected overflow skipped one
  }
}

TEST_CASE_TEMPLATE("cuda: a replayed step trains as the host's eager steps do", P, O0Policy, O2Policy, O2BF16Policy) {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> gpu;
  Context<host> cpu;
  StepRecipe<P, amp::cuda> g(gpu, {.overflow_at = 3});
  StepRecipe<P, host> c(cpu, {.overflow_at = 3});
  g.load(0);
  CapturedStep step(gpu, [&] { g.step(); });
  for (int s = 0; s < 8; ++s) {
    if (s > 0) {
      g.load(s);
      step.replay();
    }
    c.load(s);
    c.step();
  }
  compare<P>(g.snapshot(), c.snapshot(), 8, 0.05);  // 8 steps of at most 0.05 from the same bits
}

TEST_CASE_TEMPLATE("cuda: steady state: no sync, allocation, free or pageable copy after the first step", P, O0Policy,
                   O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  AMP_REQUIRE_GPU();
  for (const bool accumulate : {false, true}) {
    CAPTURE(accumulate);
    Context<amp::cuda> ctx;
    StepRecipe<P, amp::cuda> r(ctx, {.accumulate = accumulate, .overflow_at = 4});
    r.load(0);
    r.step();
    const std::size_t plans = ctx.lt_plans().size();
    const Counters first = ctx.counters();
    for (int s = 1; s < 8; ++s) {
      r.load(s);
      r.step();
    }
    const Counters d = ctx.counters() - first;
    test::check_no_host_work(d);
    CHECK(d.launches % 7 == 0);  // the same work every step
    CHECK(ctx.lt_plans().size() == plans);  // cuBLASLt plans made at the first step, reused
  }
}

TEST_CASE("cuda: a capture refuses what a graph cannot hold, and the stream stays usable") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  StepRecipe<O2Policy, amp::cuda> r(ctx, {});
  r.load(0);
  const auto refused = [&](auto&& extra, const char* why) {
    CHECK_THROWS_WITH_AS(CapturedStep(ctx, [&] {
                           r.step();
                           extra();
                         }),
                         doctest::Contains(why), Error);
    CHECK_FALSE(ctx.capturing());
  };
  refused([&] { (void)r.opt_net.last_stats(); }, "bytes to the host (a host sync)");
  refused([&] { r.opt_net.set_lr(0.5f); }, "from pageable host memory");
  refused([&] { Buffer<float, amp::cuda> grown(ctx, 4, memory_kind::workspace); }, "allocates 16 bytes of workspace");
  {  // A free inside the body is held (cudaFree would end the capture with the runtime's error) and refused.
    const std::size_t without = ctx.memory().current(memory_kind::workspace);
    std::optional<Buffer<float, amp::cuda>> held(std::in_place, ctx, 4, memory_kind::workspace);
    refused([&] { held.reset(); }, "freed 1 buffers");
    CHECK(ctx.memory().current(memory_kind::workspace) == without);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  }
  const auto before = r.snapshot();
  r.step();  // eager steps still run on the stream
  CapturedStep step(ctx, [&] { r.step(); });
  step.replay();
  CHECK(r.snapshot() != before);
}

TEST_CASE("cuda: the loader stages batches in pinned memory: no pageable copy, no sync, the same device buffers") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  data::LabelledImages set;
  set.count = 64, set.rows = 4, set.cols = 4;
  for (int i = 0; i < 64 * 16; ++i) set.pixels.push_back(static_cast<std::uint8_t>(i * 7));
  for (int i = 0; i < 64; ++i) set.labels.push_back(i % 10);
  data::Loader<float, amp::cuda> loader(ctx, set, {.batch_size = 16, .seed = 3});
  const auto first = loader.batch(0);
  const Counters before = ctx.counters();
  for (std::int64_t b = 1; b < loader.batches(); ++b) {
    const auto batch = loader.batch(b);
    CHECK(batch.x.data == first.x.data);
  }
  const Counters d = ctx.counters() - before;
  test::check_no_host_work(d);
  const auto labels = download(ctx, loader.batch(3).labels);
  const auto order = loader.state().order;
  for (std::size_t r = 0; r < labels.size(); ++r)
    CHECK(labels[r] == set.labels[static_cast<std::size_t>(order[48 + r])]);
}

TEST_CASE("cuda: GEMM sizes beyond cuBLAS's int are an error, not a wrap") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  const std::int64_t big = std::int64_t{1} << 31;
  Matrix<const half> a(nullptr, 1, big, big), b(nullptr, big, 1, 1);
  Matrix<float> c(nullptr, 1, 1, 1);
  CHECK_THROWS_WITH_AS(gemm(ctx, a, transpose::no, b, transpose::no, c), doctest::Contains("does not fit cuBLAS's int"),
                       Error);
}

TEST_CASE("cuda: contexts on two GPUs used from one thread keep their memory on their own device") {
  AMP_REQUIRE_GPU();
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < 2) {
    MESSAGE("one GPU: the two-device case needs two (the single-device path runs in every other test)");
    return;
  }
  Context<amp::cuda> a(0), b(1);
  Buffer<float, amp::cuda> x(a, 16, memory_kind::workspace);
  Buffer<float, amp::cuda> y(b, 16, memory_kind::workspace);
  fill(a, x.span(), 1.0f);
  fill(b, y.span(), 2.0f);  // the current device is 1 now
  fill(a, x.span(), 3.0f);  // and 0 again
  cudaPointerAttributes pa{}, pb{};
  cudaPointerGetAttributes(&pa, x.data());
  cudaPointerGetAttributes(&pb, y.data());
  CHECK(pa.device == 0);
  CHECK(pb.device == 1);
  CHECK(download(a, Span<const float>(x.span())) == std::vector<float>(16, 3.0f));
  CHECK(download(b, Span<const float>(y.span())) == std::vector<float>(16, 2.0f));
}
