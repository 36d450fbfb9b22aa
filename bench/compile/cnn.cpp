// What a user's CNN program compiles to, for bench/compile_time.sh: one policy,
// one backend (the GPU's under nvcc, else the CPU's), a convolutional
// classifier trained for a few steps on random images.
#include <amp/amp.hpp>

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
  constexpr std::int64_t batch = 32, classes = 10;
  nn::Sequential<P, B, nn::Conv2d, nn::BatchNorm2d, nn::ReLU, nn::MaxPool2d, nn::Conv2d, nn::BatchNorm2d, nn::ReLU,
                 nn::MaxPool2d, nn::Flatten, nn::Linear, nn::Linear>
      model(ctx, {.max_batch = batch, .inputs = {{amp::Shape{28, 28, 1}}}},
            {.in_channels = 1, .out_channels = 32, .kernel = 3, .padding = 1}, {.features = 32}, {}, {.kernel = 2},
            {.in_channels = 32, .out_channels = 64, .kernel = 3, .padding = 1}, {.features = 64}, {}, {.kernel = 2}, {},
            {.in_features = 3136, .out_features = 128, .act = amp::activation::relu},
            {.in_features = 128, .out_features = classes});
  amp::optim::AdamW<P, B> opt(model.parameters(), {.lr = 1e-3f});

  std::mt19937 gen(1);
  std::vector<float> images(batch * 28 * 28);
  std::vector<std::int32_t> labels(batch);
  for (auto& p : images) p = std::normal_distribution<float>()(gen);
  for (auto& l : labels) l = static_cast<std::int32_t>(gen() % classes);
  amp::Buffer<float, B> x(ctx, images.size(), amp::memory_kind::data);
  amp::Buffer<std::int32_t, B> y(ctx, labels.size(), amp::memory_kind::data);
  amp::upload(ctx, x.span(), images);
  amp::upload(ctx, y.span(), labels);
  const amp::TensorView<const float> xv(x.data(), amp::Shape{batch, 28, 28, 1});
  for (int step = 0; step < 5; ++step) {
    auto loss = nn::cross_entropy(ctx, model.forward(ctx, xv), amp::Span<const std::int32_t>(y.span()));
    opt.zero_grad();
    amp::scale_loss(loss, opt).backward();
    opt.step();
    std::printf("step %d: loss %.4f\n", step, loss.item());
  }
}
