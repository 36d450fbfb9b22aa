// The NCCL path of data parallel on the GPU. With one GPU (one rank, MPI
// singleton) the communicator still runs every NCCL call on its own stream with
// the event ordering; the sums over one rank are the values themselves, so a
// data-parallel run (overlapped buckets, fp32-staged or not, SyncBatchNorm)
// must match a plain run on the same GPU bit for bit. Under mpirun with more
// GPUs each rank takes the GPU of its local rank and checks that every rank
// holds the same bits. ZeRO-1 (reduce per shard, statistics all-gathered,
// shards broadcast) must step as data parallel without it, bit for bit.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>

#include "amp/amp.hpp"
#include "amp/parallel.hpp"
#include "support/gpu.cuh"
#include "support/reference.hpp"
#include "support/store_values.hpp"

using namespace amp;

namespace {
parallel::MpiCommunicator* world = nullptr;

constexpr std::int64_t features = 8, classes = 3, rows = 16;

template <Policy P>
using Net = nn::Sequential<P, amp::cuda, nn::Linear, nn::BatchNorm1d, nn::ReLU, nn::Linear>;
template <Policy P>
Net<P> make_net(Context<amp::cuda>& ctx, Collective<amp::cuda>* sync, nn::Shard shard = {}) {
  return Net<P>(ctx, {.max_batch = rows, .seed = 4, .shard = shard}, {.in_features = features, .out_features = 32},
                {.features = 32, .sync = sync}, {}, {.in_features = 32, .out_features = classes});
}

int local_gpu() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  int count = 0;
  cudaGetDeviceCount(&count);
  return local && count > 0 ? std::atoi(local) % count : 0;
}

template <Policy P, class Opt>
void train_steps(Context<amp::cuda>& ctx, Net<P>& net, Opt& opt, int steps) {
  const auto x = test::random_values<float>(rows * features, 7);
  std::vector<std::int32_t> labels(rows);
  for (std::int64_t r = 0; r < rows; ++r) labels[r] = x[r * features] > 0 ? 1 : (x[r * features + 1] > 0 ? 2 : 0);
  Buffer<float, amp::cuda> dx(ctx, x.size(), memory_kind::data);
  Buffer<std::int32_t, amp::cuda> dy(ctx, labels.size(), memory_kind::data);
  upload(ctx, dx.span(), x);
  upload(ctx, dy.span(), labels);
  for (int s = 0; s < steps; ++s) {
    auto loss = nn::cross_entropy(ctx, net.forward(ctx, matrix<const float>(dx.data(), rows, features)),
                                  Span<const std::int32_t>(dy.span()));
    opt.zero_grad();
    {
      auto scaled = scale_loss(loss, opt);
      scaled.backward();
    }
    opt.step();
  }
}
}  // namespace

TEST_CASE_TEMPLATE("NCCL data parallel on the GPU matches a plain run on it", P, O0Policy, O2Policy, O2BF16Policy) {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx(local_gpu());
  if (const auto reason = unsupported_reason<P>(ctx.capability())) {
    std::cout << "[amp-skip] " << *reason << std::endl;
    return;
  }
  parallel::NcclCommunicator nccl(*world, ctx);
  for (const bool fp32 : {false, true}) {
    auto net = make_net<P>(ctx, &nccl);
    optim::SGD<P, amp::cuda> opt(net.parameters(), {.lr = 0.1f, .momentum = 0.9f});
    parallel::DataParallel ddp(nccl, opt, {.bucket_bytes = 256, .reduce_in_fp32 = fp32});
    train_steps(ctx, net, opt, 6);
    nccl.synchronize(std::chrono::seconds(60));
    CHECK(ddp.started_in_backward() == ddp.buckets());
    const auto got = test::values_of(net.parameters());
    // Every rank holds the same bits.
    const auto all = world->all_gather(static_cast<std::int64_t>(test::fnv1a(got.data(), got.size() * sizeof(float))));
    for (auto other : all) CHECK(other == all[0]);
    if (world->size() == 1) {  // one rank: the same bits as no data parallel at all
      auto plain = make_net<P>(ctx, nullptr);
      optim::SGD<P, amp::cuda> plain_opt(plain.parameters(), {.lr = 0.1f, .momentum = 0.9f});
      train_steps(ctx, plain, plain_opt, 6);
      const auto want = test::values_of(plain.parameters());
      REQUIRE(got.size() == want.size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
      CHECK(differ == 0);
    }
  }
}

TEST_CASE_TEMPLATE("NCCL ZeRO-1 on the GPU steps as data parallel without it", P, O0Policy, O2Policy, O2BF16Policy) {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx(local_gpu());
  if (const auto reason = unsupported_reason<P>(ctx.capability())) {
    std::cout << "[amp-skip] " << *reason << std::endl;
    return;
  }
  parallel::NcclCommunicator nccl(*world, ctx);
  using AdamW = optim::AdamW<P, amp::cuda>;
  const optim::AdamOptions options{.lr = 0.01f, .weight_decay = 0.1f};
  const optim::StepOptions step{.max_grad_norm = 0.05f};
  auto zero = make_net<P>(ctx, &nccl, {world->rank(), world->size()});
  auto plain = make_net<P>(ctx, &nccl);
  AdamW zopt(zero.parameters(), options, step), popt(plain.parameters(), options, step);
  parallel::DataParallel zddp(nccl, zopt, {.bucket_bytes = 256, .zero = 1});
  parallel::DataParallel pddp(nccl, popt, {.bucket_bytes = 256});
  train_steps(ctx, zero, zopt, 6);
  train_steps(ctx, plain, popt, 6);
  nccl.synchronize(std::chrono::seconds(60));
  CHECK(zopt.applied_steps() == 6);
  using S = typename P::param_type;
  const auto& zw = zero.parameters().template arena<nn::role::weight>();
  const auto& pw = plain.parameters().template arena<nn::role::weight>();
  const auto a = download(ctx, Span<const S>(zw.values())), b = download(ctx, Span<const S>(pw.values()));
  CHECK(test::fnv1a(a.data(), a.size() * sizeof(S)) == test::fnv1a(b.data(), b.size() * sizeof(S)));
  CHECK(download(ctx, Span<const float>(zopt.template state_buffer<nn::role::weight>(1))) ==
        download(ctx, Span<const float>(popt.template state_buffer<nn::role::weight>(1).subspan(zw.shard_begin(), zw.shard_count()))));
}

int main(int argc, char** argv) {
  parallel::MpiEnvironment mpi(argc, argv);
  int failed = 0;
  {
    parallel::MpiCommunicator comm;
    world = &comm;
    doctest::Context tests(argc, argv);
    if (comm.rank() != 0) tests.setOption("out", "/dev/null");
    failed = tests.run();
    for (auto f : comm.all_gather(failed)) failed |= f != 0;
    world = nullptr;
  }
  return failed;
}
