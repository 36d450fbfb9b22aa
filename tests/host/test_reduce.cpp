#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "amp/amp.hpp"
#include "amp/parallel/data_parallel.hpp"
#include "support/reference.hpp"
#include "support/runs_op.hpp"

using namespace amp;
using namespace amp::test;

TEST_CASE("host for_each visits every index once") {
  Context<host> ctx;
  std::vector<int> hits(100003, 0);
  int* p = hits.data();
  for_each(ctx, hits.size(), [=](std::size_t i) { p[i] += static_cast<int>(i % 7) + 1; });
  for (std::size_t i = 0; i < hits.size(); ++i) REQUIRE(hits[i] == static_cast<int>(i % 7) + 1);
}

TEST_CASE("host transform_reduce: sum of squares, max |x| and non-finite count in one pass") {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{300001}}) {
    CAPTURE(n);
    auto x = random_values<half>(n, 5, -3.0f, 3.0f);
    if (n > 10) x[n / 2] = cast<half>(std::numeric_limits<float>::infinity());
    double sumsq = 0, maxabs = 0;
    int bad = 0;
    for (const half v : x) {
      const double d = cast<float>(v);
      if (!std::isfinite(d)) { ++bad; continue; }
      sumsq += d * d;
      maxabs = std::max(maxabs, std::abs(d));
    }
    Context<host> ctx;
    GradStats out{};
    transform_reduce(ctx, n, amp::detail::GradStatsOf<half>{x.data()}, amp::detail::CombineGradStats{}, GradStats{}, &out);
    CHECK(out.nonfinite == bad);
    CHECK(out.maxabs == doctest::Approx(maxabs));
    CHECK(out.sumsq == doctest::Approx(sumsq).epsilon(1e-5));

    // The result does not depend on the thread count.
    Context<host> one(1);
    GradStats serial{};
    transform_reduce(one, n, amp::detail::GradStatsOf<half>{x.data()}, amp::detail::CombineGradStats{}, GradStats{}, &serial);
    CHECK(serial.sumsq == out.sumsq);
  }
}

// Cells, runs, column sums, per-tensor statistics, the embedding gradient: the mappings shaped for the GPU.

TEST_CASE("host for_each_cell visits every cell of the grid once") {
  Context<host> ctx;
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {37, 1000}, {3000, 7}}) {
    std::vector<int> hits(static_cast<std::size_t>(rows * cols), 0);
    int* p = hits.data();
    for_each_cell(ctx, rows, cols, [=](std::int64_t r, std::int64_t c) { p[r * cols + c] += static_cast<int>(c % 5) + 1; });
    for (std::size_t i = 0; i < hits.size(); ++i) REQUIRE(hits[i] == static_cast<int>(i % static_cast<std::size_t>(cols) % 5) + 1);
  }
}

TEST_CASE("runs: a row read and written 8 values at a time, tails and any alignment") {
  Context<host> ctx;
  for (const std::int64_t width : {1, 7, 8, 13, 64, 771}) {
    CAPTURE(width);
    const std::int64_t rows = 5, ld = width + 3;  // rows misaligned to 16 bytes
    const auto x = random_values<half>(static_cast<std::size_t>(rows * ld), 7);
    std::vector<float> sums(rows);
    std::vector<half> y(x.size(), cast<half>(-1.0f));
    for_each_row(ctx, rows, width, SumAndDoubleRunsOp<half>{x.data(), ld, width, sums.data(), y.data()});
    for (std::int64_t r = 0; r < rows; ++r) {
      double want = 0;
      for (std::int64_t c = 0; c < width; ++c) {
        want += cast<float>(x[r * ld + c]);
        REQUIRE(cast<float>(y[r * ld + c]) == 2.0f * cast<float>(x[r * ld + c]));
      }
      for (std::int64_t c = width; c < ld; ++c) REQUIRE(cast<float>(y[r * ld + c]) == -1.0f);  // the tail is not overrun
      CHECK(sums[r] == doctest::Approx(want).epsilon(1e-5));
    }
  }
}

namespace {
// The tree column_sums documents, written out: 64-row chunks in fp32, strands of the chunks in fp64 past 32 chunks.
std::vector<float> column_tree(const std::vector<half>& x, std::int64_t rows, std::int64_t cols) {
  const std::int64_t chunks = (rows + 63) / 64;
  std::int64_t strands = 0;
  if (chunks > 32) {
    strands = 1;
    while (strands * strands < chunks) strands *= 2;
  }
  std::vector<float> out(static_cast<std::size_t>(cols));
  for (std::int64_t c = 0; c < cols; ++c) {
    std::vector<float> partial(static_cast<std::size_t>(chunks), 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) partial[r / 64] += cast<float>(x[r * cols + c]);
    double total = 0;
    if (strands == 0) {
      for (const float p : partial) total += p;
    } else {
      for (std::int64_t s = 0; s < strands; ++s) {
        double strand = 0;
        for (std::int64_t k = s; k < chunks; k += strands) strand += partial[k];
        total += strand;
      }
    }
    out[c] = static_cast<float>(total);
  }
  return out;
}
}  // namespace

TEST_CASE("column_sums: the documented tree's bits for any thread count, near the fp64 sums") {
  // Direct (up to 32 chunks of 64 rows) and stranded totals; widths on and off the CPU's 16-column vectors.
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{1, 5}, {100, 17}, {2048, 48}, {2117, 33},
                                  {70000, 16}, {0, 3}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    const auto x = random_values<half>(static_cast<std::size_t>(rows * cols), 11, -2.0f, 2.0f);
    std::vector<float> partial(column_sum_partials(rows, cols));  // operator new's alignment: 16 bytes
    float* aligned = partial.data();
    const auto run = [&](int threads) {
      Context<host> ctx(threads);
      std::vector<float> out(static_cast<std::size_t>(cols), -1.0f);
      const auto before = ctx.counters().launches;
      column_sums(ctx, rows, cols, amp::detail::ValueAt<half>{x.data(), cols}, aligned, out.data());
      CHECK(ctx.counters().launches - before == (rows == 0 ? 1u : rows > 32 * 64 ? 3u : 2u));
      return out;
    };
    const auto got = run(0);
    CHECK(got == run(1));
    CHECK(got == column_tree(x, rows, cols));
    for (std::int64_t c = 0; c < cols; ++c) {
      double want = 0, size = 0;
      for (std::int64_t r = 0; r < rows; ++r) want += cast<float>(x[r * cols + c]), size += std::abs(cast<float>(x[r * cols + c]));
      CHECK(std::abs(got[c] - want) <= 1e-6 * size + 1e-6);
    }
    // add_column_sums: into a half gradient, the sum added in fp32 and rounded once.
    Context<host> ctx;
    std::vector<half> grad(static_cast<std::size_t>(cols), cast<half>(0.75f));
    add_column_sums(ctx, rows, cols, amp::detail::ValueAt<half>{x.data(), cols}, aligned, grad.data());
    for (std::int64_t c = 0; c < cols; ++c) CHECK(detail::bits(grad[c]) == detail::bits(cast<half>(0.75f + got[c])));
  }
}

TEST_CASE("TensorStats: every tensor's statistics and their total in three launches") {
  // Tensors with padding between them, one past a 65536-element chunk, one empty, one with an inf.
  const std::vector<std::size_t> offsets{0, 40, 40, 200000, 200100}, counts{33, 0, 150000, 100, 70000};
  auto g = random_values<half>(270100, 21, -3.0f, 3.0f);
  g[200050] = cast<half>(std::numeric_limits<float>::infinity());
  Context<host> ctx;
  TensorStats<host> stats(ctx, offsets, counts);
  std::vector<GradStats> per(offsets.size());
  GradStats total{1.0, 9.0f, 0};  // first = true: overwritten
  const auto before = ctx.counters().launches;
  stats(ctx, Span<const half>(g.data(), g.size()), per.data(), &total, true);
  CHECK(ctx.counters().launches - before == 3);
  double all = 0, all_max = 0;
  for (std::size_t t = 0; t < offsets.size(); ++t) {
    CAPTURE(t);
    double sumsq = 0, maxabs = 0;
    int bad = 0;
    for (std::size_t i = offsets[t]; i < offsets[t] + counts[t]; ++i) {
      const double v = cast<float>(g[i]);
      if (!std::isfinite(v)) { ++bad; continue; }
      sumsq += v * v, maxabs = std::max(maxabs, std::abs(v));
    }
    CHECK(per[t].sumsq == doctest::Approx(sumsq).epsilon(1e-12));
    CHECK(per[t].maxabs == maxabs);
    CHECK(per[t].nonfinite == bad);
    all += sumsq, all_max = std::max(all_max, maxabs);
  }
  CHECK(total.sumsq == doctest::Approx(all).epsilon(1e-12));
  CHECK(total.maxabs == all_max);
  CHECK(total.nonfinite == 1);
  // first = false adds to what the total held; the bits do not depend on the thread count.
  Context<host> one(1);
  std::vector<GradStats> per1(offsets.size());
  GradStats twice = total;
  stats(one, Span<const half>(g.data(), g.size()), per1.data(), &twice, false);
  CHECK(twice.sumsq == doctest::Approx(2 * all).epsilon(1e-12));
  CHECK(twice.nonfinite == 2);
  for (std::size_t t = 0; t < offsets.size(); ++t) CHECK(per1[t].sumsq == per[t].sumsq);
}

TEST_CASE_TEMPLATE("embedding gradient: each token's rows summed per column in row order, rounded once", GW, float, half) {
  for (const std::int64_t features : {13, 64}) {
    CAPTURE(features);
    constexpr std::int64_t vocab = 50, rows = 300;
    std::vector<std::int32_t> ids(rows);
    for (std::int64_t i = 0; i < rows; ++i) ids[i] = static_cast<std::int32_t>(i % 3 == 0 ? 7 : (i * 13) % vocab);
    ids[5] = -1, ids[6] = vocab;  // outside the table: nothing
    const auto dy = random_values<half>(static_cast<std::size_t>(rows * features), 31);
    auto grad = random_values<GW>(static_cast<std::size_t>(vocab * features), 32);
    auto want = grad;
    for (std::int64_t v = 0; v < vocab; ++v)
      for (std::int64_t c = 0; c < features; ++c) {
        float acc = 0.0f;
        bool any = false;
        for (std::int64_t r = 0; r < rows; ++r)
          if (ids[r] == v) acc += cast<float>(dy[r * features + c]), any = true;
        if (any) want[v * features + c] = cast<GW>(cast<float>(want[v * features + c]) + acc);
      }
    Context<host> ctx;
    std::vector<std::int32_t> sorted(rows), keys(rows), offsets(rows + 1), count(1);
    std::vector<std::uint64_t> temp(rows);
    const KeyGroups groups{sorted.data(), keys.data(), offsets.data(), count.data()};
    group_by_key(ctx, ids.data(), rows, groups, temp.data());
    nn::detail::add_embedding_grad(ctx, groups, dy.data(), rows, vocab, features, grad.data());
    for (std::size_t i = 0; i < grad.size(); ++i) REQUIRE(cast<float>(grad[i]) == cast<float>(want[i]));
  }
}

namespace {
// Rank 0 of 2 whose peer adds nothing: it records the calls (R reduce, B broadcast, ( and ) a group).
struct RecordingCollective final : Collective<host> {
  std::string calls;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_reduce_sum(Context<host>&, void*, std::size_t, element) override { calls += 'A'; }
  void start_all_reduce_sum(Context<host>&, void*, std::size_t, element) override { calls += 'A'; }
  void start_all_reduce_max(Context<host>&, float*, std::size_t) override { calls += 'M'; }
  void finish(Context<host>&) override {}
  void start_reduce_sum(Context<host>&, void*, std::size_t, element, int) override { calls += 'R'; }
  void group_start() override { calls += '('; }
  void group_end() override { calls += ')'; }
  void broadcast(Context<host>&, void*, std::size_t, int) override { calls += 'B'; }
  void all_gather(Context<host>&, void* data, std::size_t bytes) override {
    std::memcpy(static_cast<char*>(data) + bytes, data, bytes);  // the peer's statistics: this rank's again
  }
  std::vector<std::int64_t> all_gather(std::int64_t value) override { return {value, value}; }
};
}  // namespace

TEST_CASE("ZeRO-1: each bucket's reduces and the shards' broadcasts go out as one group each") {
  using P = O2Policy;
  Context<host> ctx(1);
  nn::Sequential<P, host, nn::Linear, nn::ReLU, nn::Linear> net(
      ctx, {.max_batch = 8, .seed = 5, .shard = {0, 2}}, {.in_features = 8, .out_features = 64}, {},
      {.in_features = 64, .out_features = 3});
  optim::SGD<P, host> opt(net.parameters(), {.lr = 0.01f});
  RecordingCollective comm;
  parallel::DataParallel ddp(comm, opt, {.bucket_bytes = 512, .zero = 1});
  const auto x = random_values<float>(8 * 8, 3);
  const std::vector<std::int32_t> labels{0, 1, 2, 0, 1, 2, 0, 1};
  comm.calls.clear();
  auto loss = nn::cross_entropy(ctx, net.forward(ctx, matrix<const float>(x.data(), 8, 8)), Span<const std::int32_t>(labels.data(), labels.size()));
  opt.zero_grad();
  scale_loss(loss, opt).backward();
  opt.step();
  // Every reduce inside a group, a group per bucket; then a group of broadcasts per role's arena that has elements.
  std::string reduces, broadcasts;
  std::size_t groups = 0;
  for (std::size_t i = comm.calls.find('('); i != std::string::npos; i = comm.calls.find('(', i + 1)) {
    const std::size_t end = comm.calls.find(')', i);
    REQUIRE(end != std::string::npos);
    const std::string inside = comm.calls.substr(i + 1, end - i - 1);
    ++groups;
    if (inside.empty()) continue;
    CHECK(inside.find_first_not_of(inside[0]) == std::string::npos);  // reduces or broadcasts, never mixed
    (inside[0] == 'R' ? reduces : broadcasts) += inside;
  }
  CHECK(ddp.buckets() > 1);
  CHECK(groups == ddp.buckets() + 1);  // the weights' broadcasts; the empty norm and fp32 roles send nothing
  CHECK(std::count(comm.calls.begin(), comm.calls.end(), 'R') == static_cast<long>(reduces.size()));
  CHECK(std::count(comm.calls.begin(), comm.calls.end(), 'B') == static_cast<long>(broadcasts.size()));
  CHECK(broadcasts == "BB");  // the two ranks' shards of the weights
  CHECK(reduces.size() >= ddp.buckets());
}

namespace {
template <class P, class B>
using KeptLinear = nn::Linear<KeepFp32<P>, B>;
}  // namespace

TEST_CASE("ZeRO-1 with a head kept in fp32: its role is bucketed, reduced and its shards broadcast") {
  using P = O2Policy;
  Context<host> ctx(1);
  nn::Sequential<P, host, nn::Linear, nn::ReLU, KeptLinear> net(
      ctx, {.max_batch = 8, .seed = 5, .shard = {0, 2}}, {.in_features = 8, .out_features = 64}, {},
      {.in_features = 64, .out_features = 3});
  const auto& head = net.parameters().arena<nn::role::fp32>();
  REQUIRE(head.count() == 384);  // 3 x 64 and 3, in 128-element blocks
  CHECK(head.shard_count() < head.count());
  CHECK(head.master().size == 0);  // fp32 values are their own master
  optim::SGD<P, host> opt(net.parameters(), {.lr = 0.01f});
  RecordingCollective comm;
  parallel::DataParallel ddp(comm, opt, {.bucket_bytes = 512, .zero = 1});
  const auto x = random_values<float>(8 * 8, 3);
  const std::vector<std::int32_t> labels{0, 1, 2, 0, 1, 2, 0, 1};
  comm.calls.clear();
  auto loss = nn::cross_entropy(ctx, net.forward(ctx, matrix<const float>(x.data(), 8, 8)), Span<const std::int32_t>(labels.data(), labels.size()));
  opt.zero_grad();
  scale_loss(loss, opt).backward();
  opt.step();
  CHECK(opt.applied_steps() == 1);
  // The last groups: the weights' two shards, then the fp32 head's two.
  CHECK(comm.calls.substr(comm.calls.size() - 8) == "(BB)(BB)");
  CHECK(ddp.bytes_per_step() == 2 * net.parameters().arena<nn::role::weight>().count() + 4 * head.count());
}
