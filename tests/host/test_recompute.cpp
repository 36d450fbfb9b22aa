// Activation checkpointing (nn::checkpoint): the same gradients, losses and
// weights as the plain run, bit for bit (dropout included), in less
// activation memory; nested blocks, BatchNorm's statistics counted once, and
// the blocks it refuses.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "amp/transformer.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
constexpr std::int64_t kBatch = 2, kTime = 16;

struct Run {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;  // the weight and norm gradient arenas after the first backward
  std::vector<float> weights;             // every parameter's fp32 view at the end
  std::size_t activations = 0;            // peak bytes
  std::vector<float> eval_logits;         // an evaluation forward after training
  bool spilled = false;                   // it needed memory beyond the plan
};

template <class G>
std::vector<float> as_float(Context<host>& ctx, Span<G> g) {
  std::vector<float> out;
  for (const G v : download(ctx, Span<const G>(g))) out.push_back(cast<float>(v));
  return out;
}

// `steps` AdamW steps of next-token prediction with a 3-block GPT2, dropout 0.1 everywhere.
template <class P>
Run train(bool checkpoint, int steps, std::int64_t layers = 3) {
  Context<host> ctx;
  const nn::GPT2Config c{.vocab_size = 23, .n_positions = kTime, .n_layer = layers, .n_head = 2, .n_embd = 16,
                         .dropout = 0.1f, .checkpoint_blocks = checkpoint};
  nn::Model<P, host, nn::GPT2<P, host>> model(ctx, {.max_batch = kBatch, .seed = 5}, c);
  optim::AdamW<P, host> opt(model.parameters(), {.lr = 0.01f, .weight_decay = 0.1f}, {.max_grad_norm = 1.0f});
  std::vector<std::int32_t> ids(kBatch * kTime), next(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7 + i / 5) % 23);
  for (std::size_t i = 0; i < ids.size(); ++i) next[i] = ids[(i + 1) % ids.size()];
  Run r;
  for (int step = 0; step < steps; ++step) {
    auto out = model.forward(ctx, TensorView<const std::int32_t>(ids.data(), Shape{kBatch, kTime}));
    auto loss = nn::cross_entropy(ctx, out, Span<const std::int32_t>(next.data(), next.size()));
    opt.zero_grad();
    scale_loss(loss, opt).backward();
    if (step == 0) {
      r.grads.push_back(as_float(ctx, model.parameters().template arena<nn::role::weight>().grads()));
      r.grads.push_back(as_float(ctx, model.parameters().template arena<nn::role::norm>().grads()));
    }
    opt.step();
    r.losses.push_back(loss.item());
  }
  for (std::size_t i = 0; i < model.parameters().table().size(); ++i) {
    const auto v = model.parameters().get_values(static_cast<int>(i));
    r.weights.insert(r.weights.end(), v.begin(), v.end());
  }
  r.activations = ctx.memory().peak(memory_kind::activations);
  const std::size_t planned = model.graph().arena_bytes();
  model.eval();
  auto out = model.forward(ctx, TensorView<const std::int32_t>(ids.data(), Shape{kBatch, kTime}));
  for (std::size_t i = 0; i < static_cast<std::size_t>(out.rows() * out.cols()); ++i)
    r.eval_logits.push_back(cast<float>(out.value().data[i]));
  r.spilled = model.graph().arena_bytes() != planned;
  return r;
}
}  // namespace

TEST_CASE_TEMPLATE("checkpointed GPT2 blocks: gradients, losses and weights bit for bit the plain run's, dropout included",
                   P, O0Policy, O2Policy, O2BF16Policy, O3Policy) {
  const Run plain = train<P>(false, 6), kept = train<P>(true, 6);
  REQUIRE(plain.grads.size() == kept.grads.size());
  for (std::size_t k = 0; k < plain.grads.size(); ++k) CHECK(plain.grads[k] == kept.grads[k]);
  CHECK(plain.losses == kept.losses);
  CHECK(plain.weights == kept.weights);
  CHECK(plain.losses.back() < plain.losses.front());  // it trains
  CHECK(plain.eval_logits == kept.eval_logits);       // evaluation checkpoints too: the same logits, within the plan
  CHECK_FALSE(kept.spilled);
  // Less activation memory: each block keeps its input alone; one block's activations live at a time.
  MESSAGE("activations: plain ", plain.activations, " B, checkpointed ", kept.activations, " B");
  CHECK(kept.activations < plain.activations * 3 / 4);
}

TEST_CASE("checkpointing: the saving grows with the depth (one block's activations live at a time)") {
  const Run plain = train<O2BF16Policy>(false, 1, 6), kept = train<O2BF16Policy>(true, 1, 6);
  const double ratio = static_cast<double>(kept.activations) / static_cast<double>(plain.activations);
  MESSAGE("6 blocks: activations ", kept.activations, " B checkpointed, ", plain.activations, " B plain: ", ratio);
  CHECK(ratio < 0.5);
  CHECK(plain.grads == kept.grads);
}

namespace {
// A residual pair of Linears with dropout and BatchNorm between them, checkpointed as a lambda, nested or not.
template <class P, class B>
struct Blocks {
  using T = typename P::activation_type;
  nn::Linear<P, B> a, b, head;
  nn::BatchNorm1d<P, B> bn;
  int mode = 0;  // 0 plain, 1 checkpointed, 2 nested (the inner pair inside the outer checkpoint)
  explicit Blocks(nn::Builder<P, B> bld)
      : a(bld.child("a"), {.in_features = 8, .out_features = 8, .act = activation::gelu}),
        b(bld.child("b"), {.in_features = 8, .out_features = 8}),
        head(bld.child("head"), {.in_features = 8, .out_features = 3}),
        bn(bld.child("bn"), {.features = 8}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{8}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) {
    auto inner = [this](nn::Graph<P, B>& gg, nn::Var<T> h) { return b(gg, nn::dropout(gg, a(gg, h), 0.25f)); };
    auto outer = [this, inner](nn::Graph<P, B>& gg, nn::Var<T> h) {
      const nn::Var<T> y = mode == 2 ? nn::checkpoint(gg, inner, bn(gg, h)) : inner(gg, bn(gg, h));
      return nn::add(gg, y, h);
    };
    const nn::Var<T> h = mode == 0 ? outer(g, x) : nn::checkpoint(g, outer, x);
    return head(g, h);
  }
};
}  // namespace

TEST_CASE("checkpointing a lambda, nested: the same gradients; BatchNorm's running statistics counted once") {
  std::vector<std::vector<float>> grads, stats;
  for (int mode = 0; mode < 3; ++mode) {
    CAPTURE(mode);
    Context<host> ctx;
    nn::Model<O0Policy, host, Blocks<O0Policy, host>> model(ctx, {.max_batch = 4, .seed = 3});
    model.net().mode = mode;
    optim::SGD<O0Policy, host> opt(model.parameters(), {.lr = 0.1f});
    const auto x = random_values<float>(4 * 8, 7);
    std::vector<std::int32_t> labels{0, 2, 1, 2};
    for (int step = 0; step < 3; ++step) {
      auto out = model.forward(ctx, TensorView<const float>(x.data(), Shape{4, 8}));
      auto loss = nn::cross_entropy(ctx, out, Span<const std::int32_t>(labels.data(), labels.size()));
      opt.zero_grad();
      scale_loss(loss, opt).backward();
      opt.step();
    }
    grads.push_back(download(ctx, Span<const float>(model.parameters().arena<nn::role::weight>().grads())));
    stats.push_back(download(ctx, Span<const float>(model.parameters().buffer_values())));
  }
  CHECK(grads[1] == grads[0]);
  CHECK(grads[2] == grads[0]);
  CHECK(stats[1] == stats[0]);  // running mean, variance and the batch count: 3 updates, not 6
  CHECK(stats[2] == stats[0]);
}

namespace {
template <class P, class B>
struct Misused {
  using T = typename P::activation_type;
  nn::Linear<P, B> a;
  explicit Misused(nn::Builder<P, B> bld) : a(bld.child("a"), {.in_features = 4, .out_features = 4}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{4}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) {
    const nn::Var<T> side = a(g, x);
    // The block reads `side`, a tensor from outside it that is not its input.
    return nn::checkpoint(g, [side](nn::Graph<P, B>& gg, nn::Var<T> h) { return nn::add(gg, h, side); }, a(g, x));
  }
};
}  // namespace

namespace {
template <class P, class B>
struct Identity {
  using T = typename P::activation_type;
  nn::Linear<P, B> a;
  explicit Identity(nn::Builder<P, B> bld) : a(bld.child("a"), {.in_features = 4, .out_features = 4}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{4}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) {
    return nn::checkpoint(g, [](nn::Graph<P, B>&, nn::Var<T> h) { return h; }, a(g, x));
  }
};
}  // namespace

TEST_CASE("checkpointing refuses a block that returns its input") {
  Context<host> ctx;
  CHECK_THROWS_WITH_AS((nn::Model<O0Policy, host, Identity<O0Policy, host>>(ctx, {.max_batch = 2})),
                       doctest::Contains("checkpoint: the block returned its input"), Error);
}

TEST_CASE("checkpointing refuses a block that reads another outside tensor (when the model is built)") {
  Context<host> ctx;
  CHECK_THROWS_WITH_AS((nn::Model<O0Policy, host, Misused<O0Policy, host>>(ctx, {.max_batch = 2})),
                       doctest::Contains("checkpoint: the checkpointed block reads a tensor from outside it other than "
                                         "its input"),
                       Error);
}
