#pragma once
// The attention layer's own launches, counted where the code both backends
// share issues them: the layer alone against the two Linears it holds alone
// (c_attn's [features -> 3 x features] and a projection back), each on its
// model's second step (nothing left to set up). tests/host/test_attention.cpp
// and its CUDA twin count with it.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "amp/transformer.hpp"
#include "support/reference.hpp"

namespace amp::test {

using AttentionConfig = nn::CausalSelfAttention<O0Policy, host>::Config;  // the same record for every P, B

template <class P, class B>
struct AttentionAlone {
  using T = typename P::activation_type;
  nn::CausalSelfAttention<P, B> attn;
  std::int64_t features, time;
  AttentionAlone(nn::Builder<P, B> b, const AttentionConfig& cfg, std::int64_t t)
      : attn(b.child("attn"), {.features = cfg.features, .heads = cfg.heads, .dropout = cfg.dropout,
                               .kernel = cfg.kernel}),
        features(cfg.features),
        time(t) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{time, features}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) { return attn(g, x); }
};
template <class P, class B>
struct ItsLinears {
  using T = typename P::activation_type;
  nn::Linear<P, B> qkv, proj;
  std::int64_t features, time;
  ItsLinears(nn::Builder<P, B> b, const AttentionConfig& cfg, std::int64_t t)
      : qkv(b.child("qkv"), {.in_features = cfg.features, .out_features = 3 * cfg.features}),
        proj(b.child("proj"), {.in_features = 3 * cfg.features, .out_features = cfg.features}),
        features(cfg.features),
        time(t) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{time, features}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) { return proj(g, qkv(g, x)); }
};

struct Launches {
  std::size_t forward, backward;
};
template <class P, class Net, class B>
Launches launches_per_step(Context<B>& ctx, const AttentionConfig& cfg, std::int64_t time, std::int64_t batch = 2) {
  nn::Model<P, B, Net> model(ctx, {.max_batch = batch, .seed = 2}, cfg, time);
  const auto x = random_values<float>(static_cast<std::size_t>(batch * time * cfg.features), 5),
             target = random_values<float>(static_cast<std::size_t>(batch * time * cfg.features), 6);
  Launches l{};
  for (int step = 0; step < 2; ++step) {
    const std::size_t start = ctx.counters().launches;
    auto out = model.forward(ctx, TensorView<const float>(x.data(), Shape{batch, time, cfg.features}));
    l.forward = ctx.counters().launches - start;
    auto loss = nn::mse_loss(ctx, out, TensorView<const float>(target.data(), out.shape()));
    model.parameters().zero_grad();
    const std::size_t before = ctx.counters().launches;
    loss.backward();
    l.backward = ctx.counters().launches - before;
  }
  return l;
}

}  // namespace amp::test
