#pragma once
// One training step with every feature a captured step must carry, on either
// backend: dropout, LayerNorm, clipping, a warm-up + cosine schedule,
// per-tensor norms, an explicit unscale with an edit of the unscaled
// gradients, and two optimizers (AdamW, SGD with momentum) on one scaler; or
// gradient accumulation over two micro-batches in the three-line form. Its
// batches sit in fixed backend buffers, refilled from pinned staging before
// each step (an overflow can be injected into the first), so the same body
// serves eager steps, the steady-state counter tests and captured replays.
#include <cstdint>
#include <limits>
#include <vector>

#include "amp/amp.hpp"

namespace amp::test {

template <class P, class B>
struct RecipeNet {
  using T = typename P::activation_type;
  nn::Linear<P, B> l1;
  nn::LayerNorm<P, B> ln;
  nn::Dropout<P, B> drop;
  nn::Linear<P, B> l2;
  explicit RecipeNet(nn::Builder<P, B> b)
      : l1(b.child("l1"), {.in_features = 8, .out_features = 16, .act = activation::relu}),
        ln(b.child("ln"), {.features = 16}),
        drop(b.child("drop"), {.p = 0.25f}),
        l2(b.child("l2"), {.in_features = 16, .out_features = 4}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{8}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) { return l2(g, drop(g, ln(g, l1(g, x)))); }
};

template <class P, class B>
using RecipeHead = nn::Sequential<P, B, nn::Linear>;  // a Model already

// An edit of unscaled gradients between unscale and step: g *= 0.5.
struct HalveOp {
  float* g;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { g[i] *= 0.5f; }
};

// The policy's scaler starting at 2^10, not 2^16: these small nets' fp16
// gradients overflow at 2^16 now and then, and the tests count the injected overflow.
template <Policy P>
constexpr ScalerConfig recipe_scaler() {
  ScalerConfig cfg = default_scaler_config<P>();
  if (P::loss_scaling == scaling::dynamic) cfg.init_scale = 1024.0f;
  return cfg;
}

template <Policy P, Backend B>
struct StepRecipe {
  static constexpr std::int64_t batch = 8, features = 8, classes = 4;

  struct Options {
    bool accumulate = false;   // two micro-batches per step, the three-line form, one model
    int overflow_at = -1;      // the step whose first batch holds an inf
  };

  Context<B>& ctx;
  Options options;
  nn::Model<P, B, RecipeNet<P, B>> net;
  RecipeHead<P, B> head;
  optim::AdamW<P, B> opt_net;
  optim::SGD<P, B> opt_head;
  default_scaler_t<P, B> scaler;
  Buffer<float, B> x;  // the micro-batches, one after the other
  Buffer<std::int32_t, B> y;
  Staging<float, B> stage_x;
  Staging<std::int32_t, B> stage_y;

  StepRecipe(Context<B>& c, Options o)
      : ctx(c),
        options(o),
        net(c, {.max_batch = batch, .seed = 11}),
        head(c, {.max_batch = batch, .seed = 12}, {.in_features = features, .out_features = classes}),
        opt_net(net.parameters(), {.lr = 0.01f},
                {.max_grad_norm = 1.0f, .accumulation_steps = o.accumulate ? 2 : 1, .per_tensor_norms = true,
                 .scaler = recipe_scaler<P>()}),
        opt_head(head.parameters(), {.lr = 0.05f, .momentum = 0.9f}, {.scaler = recipe_scaler<P>()}),
        scaler(c, recipe_scaler<P>()),
        x(c, 2 * batch * features, memory_kind::data),
        y(c, 2 * batch, memory_kind::data),
        stage_x(c, 2 * batch * features),
        stage_y(c, 2 * batch) {
    opt_net.set_schedule(optim::LinearWarmup<optim::CosineLR>{3, {0.01f, 40, 0.001f}});
  }

  // Step `step`'s batches into the fixed buffers: pinned staging, copied on the stream.
  void load(int step) {
    float* hx = stage_x.next().data;
    std::int32_t* hy = stage_y.next().data;
    // Values from integer hashing, exact on every compiler: libm's sin, folded
    // at compile time in one caller and not in another, gave two callers of
    // load(1) inputs one ulp apart.
    for (std::int64_t i = 0; i < 2 * batch * features; ++i) {
      const std::uint64_t h = nn::mix64(static_cast<std::uint64_t>(step) * 4096 + static_cast<std::uint64_t>(i));
      hx[i] = static_cast<float>(h >> 40) * 0x1p-23f - 1.0f;  // in [-1, 1)
    }
    for (std::int64_t r = 0; r < 2 * batch; ++r) hy[r] = static_cast<std::int32_t>((r % batch + step + r / batch) % classes);
    if (step == options.overflow_at) hx[3] = std::numeric_limits<float>::infinity();
    stage_x.upload(x.span(), x.size());
    stage_y.upload(y.span(), y.size());
  }

  TensorView<const float> input(int m) const { return {x.data() + m * batch * features, Shape{batch, features}}; }
  Span<const std::int32_t> labels(int m) const { return {y.data() + m * batch, static_cast<std::size_t>(batch)}; }

  // One training step on the loaded batches: what a CapturedStep captures.
  void step() {
    if (options.accumulate) {
      for (int m = 0; m < 2; ++m) {
        auto loss = nn::cross_entropy(ctx, net.forward(ctx, input(m)), labels(m));
        opt_net.zero_grad();
        {
          auto scaled = scale_loss(loss, opt_net);
          scaled.backward();
        }
        opt_net.step();  // steps at the second micro-batch
      }
      return;
    }
    auto loss_net = nn::cross_entropy(ctx, net.forward(ctx, input(0)), labels(0));
    auto loss_head = nn::cross_entropy(ctx, head.forward(ctx, input(0)), labels(0));
    opt_net.zero_grad();
    opt_head.zero_grad();
    {
      auto a = scaler.scale(loss_net);
      a.backward();
      auto b = scaler.scale(loss_head);
      b.backward();
    }
    scaler.unscale(opt_net);
    const Span<float> g = opt_net.gradients().unscaled(net.parameters(), 0);
    for_each(ctx, g.size, HalveOp{g.data});
    scaler.step(opt_net);
    scaler.step(opt_head);
    scaler.update();
  }

  // Every trained value, optimizer state and scaler state, in one vector (for bitwise comparison).
  std::vector<float> snapshot() {
    std::vector<float> all;
    const auto add = [&](const std::vector<float>& v) { all.insert(all.end(), v.begin(), v.end()); };
    for (const auto* store : {&net.parameters(), &head.parameters()})
      for (std::size_t i = 0; i < store->table().size(); ++i) add(store->get_values(static_cast<int>(i)));
    add(download(ctx, Span<const float>(opt_net.template state_buffer<nn::role::weight>(0))));
    add(download(ctx, Span<const float>(opt_net.template state_buffer<nn::role::weight>(1))));
    add(download(ctx, Span<const float>(opt_head.template state_buffer<nn::role::weight>(0))));
    const auto sc = (options.accumulate ? opt_net.scaler() : scaler).stats();
    add({sc.scale, static_cast<float>(sc.steps), static_cast<float>(sc.skipped)});
    add({static_cast<float>(opt_net.applied_steps()), static_cast<float>(opt_net.steps()),
         static_cast<float>(opt_head.applied_steps())});
    return all;
  }
};

}  // namespace amp::test
