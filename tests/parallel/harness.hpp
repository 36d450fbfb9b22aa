#pragma once
// What the data-parallel test files share: the job's communicator, a small
// MLP, the global batch of a step, one training step and fingerprints.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "amp/amp.hpp"
#include "amp/parallel.hpp"
#include "support/reference.hpp"
#include "support/store_values.hpp"

namespace amp::test {
inline parallel::MpiCommunicator* world = nullptr;

constexpr std::int64_t features = 8, classes = 3;

template <Policy P>
using Mlp = nn::Sequential<P, host, nn::Linear, nn::ReLU, nn::Linear>;
template <Policy P>
inline Mlp<P> make_mlp(Context<host>& ctx, std::int64_t max_batch, std::uint64_t seed, std::int64_t hidden = 32) {
  return Mlp<P>(ctx, {.max_batch = max_batch, .seed = seed}, {.in_features = features, .out_features = hidden}, {},
                {.in_features = hidden, .out_features = classes});
}

template <Policy P>
using BnNet = nn::Sequential<P, host, nn::Linear, nn::BatchNorm1d, nn::ReLU, nn::Linear>;
template <Policy P>
inline BnNet<P> make_bn_net(Context<host>& ctx, std::int64_t max_batch, Collective<host>* sync, nn::Shard shard = {}) {
  return BnNet<P>(ctx, {.max_batch = max_batch, .seed = 3, .shard = shard}, {.in_features = features, .out_features = 16},
                  {.features = 16, .sync = sync}, {}, {.in_features = 16, .out_features = classes});
}

// The global batch of step `step`: 2B rows, the same on every rank.
struct Batch {
  std::vector<float> x;
  std::vector<std::int32_t> labels;
};
inline Batch global_batch(std::int64_t rows, int step) {
  Batch b{test::random_values<float>(static_cast<std::size_t>(rows * features), 100u + static_cast<unsigned>(step)),
          std::vector<std::int32_t>(static_cast<std::size_t>(rows))};
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = b.x.data() + r * features;
    b.labels[static_cast<std::size_t>(r)] = x[0] + x[1] > 0.3f ? 1 : (x[2] * x[3] > 0 ? 2 : 0);
  }
  return b;
}

// Forward, scaled backward and step on rows [first, first + rows) of a batch.
template <class Net, class Opt>
float train_on(Context<host>& ctx, Net& net, Opt& opt, const Batch& b, std::int64_t first, std::int64_t rows,
               bool zero = true) {
  auto y = net.forward(ctx, matrix<const float>(b.x.data() + first * features, rows, features));
  auto loss = nn::cross_entropy(ctx, y, Span<const std::int32_t>(b.labels.data() + first, static_cast<std::size_t>(rows)));
  if (zero) opt.zero_grad();
  {
    auto scaled = scale_loss(loss, opt);
    scaled.backward();
  }
  return loss.item();
}

// The stored values, masters and buffers as bits.
template <class Store>
std::int64_t fingerprint(Store& s) {
  auto& w = s.template arena<nn::role::weight>();
  auto& n = s.template arena<nn::role::norm>();
  std::uint64_t h = test::fnv1a(w.values().data, w.values().size * sizeof(*w.values().data));
  h = test::fnv1a(w.master().data, w.master().size * sizeof(float), h);
  h = test::fnv1a(n.values().data, n.values().size * sizeof(*n.values().data), h);
  h = test::fnv1a(s.buffer_values().data, s.buffer_values().size * sizeof(float), h);
  return static_cast<std::int64_t>(h);
}
// The stored values alone (under ZeRO-1 every rank has them all, and masters of its shard only): as bits.
template <class Store>
std::int64_t values_bits(Store& s) {
  auto& w = s.template arena<nn::role::weight>();
  auto& n = s.template arena<nn::role::norm>();
  std::uint64_t h = fnv1a(w.values().data, w.values().size * sizeof(*w.values().data));
  h = fnv1a(n.values().data, n.values().size * sizeof(*n.values().data), h);
  h = fnv1a(s.buffer_values().data, s.buffer_values().size * sizeof(float), h);
  return static_cast<std::int64_t>(h);
}
inline bool same_on_every_rank(std::int64_t v) {
  const auto all = world->all_gather(v);
  for (auto x : all)
    if (x != all[0]) return false;
  return true;
}
inline double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}
}  // namespace amp::test
