// What a user's GPT-2 program compiles to, for bench/compile_time.sh: one
// policy, one backend (the GPU's under nvcc, else the CPU's), a small GPT-2
// trained for a few steps on random tokens, then a few generated tokens.
#include <amp/transformer.hpp>

#include <cstdio>
#include <random>
#include <vector>

#if defined(__CUDACC__)
using B = amp::cuda;
#else
using B = amp::host;
#endif
using P = amp::O2BF16Policy;
namespace nn = amp::nn;

int main() {
  amp::Context<B> ctx;
  constexpr std::int64_t batch = 8, context = 64;
  const nn::GPT2Config config{.vocab_size = 256, .n_positions = context, .n_layer = 2, .n_head = 4, .n_embd = 128};
  nn::Model<P, B, nn::GPT2<P, B>> model(ctx, {.max_batch = batch, .seed = 1}, config);
  amp::optim::AdamW<P, B> opt(model.parameters(), {.lr = 3e-3f}, {.max_grad_norm = 1.0f});

  std::mt19937 gen(1);
  std::vector<std::int32_t> ids(batch * context), targets(batch * context);
  for (auto& t : ids) t = static_cast<std::int32_t>(gen() % 256);
  for (std::size_t i = 0; i < ids.size(); ++i) targets[i] = ids[(i + 1) % ids.size()];
  amp::Buffer<std::int32_t, B> x(ctx, ids.size(), amp::memory_kind::data), y(ctx, targets.size(), amp::memory_kind::data);
  amp::upload(ctx, x.span(), ids);
  amp::upload(ctx, y.span(), targets);
  const amp::TensorView<const std::int32_t> xv(x.data(), amp::Shape{batch, context});
  for (int step = 0; step < 5; ++step) {
    auto loss = nn::cross_entropy(ctx, model.forward(ctx, xv), amp::Span<const std::int32_t>(y.span()));
    opt.zero_grad();
    amp::scale_loss(loss, opt).backward();
    opt.step();
    std::printf("step %d: loss %.4f\n", step, loss.item());
  }
  const auto sample = nn::generate(model, {1, 2, 3}, 8, {.temperature = 0.0f});
  std::printf("generated %zu tokens\n", sample.size());
}
