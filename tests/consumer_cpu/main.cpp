// The Apex seed on the CPU through the host component alone: Linear 256 -> 128,
// MSE, SGD; at O0 and O2-bf16, each loss must fall.
#include <amp/amp.hpp>

#include <cstdio>
#include <random>
#include <vector>

template <amp::Policy P>
bool train(amp::Context<amp::host>& ctx, const std::vector<float>& x, const std::vector<float>& y) {
  constexpr std::int64_t n = 32, in = 256, out = 128;
  amp::nn::Sequential<P, amp::host, amp::nn::Linear> model(ctx, {.max_batch = n, .seed = 1},
                                                          {.in_features = in, .out_features = out});
  amp::optim::SGD<P, amp::host> opt(model.parameters(), {.lr = 0.05f});
  const auto xm = amp::matrix<const float>(x.data(), n, in);
  const auto ym = amp::matrix<const float>(y.data(), n, out);
  float first = 0, last = 0;
  for (int it = 0; it < 50; ++it) {
    auto loss = amp::nn::mse_loss(ctx, model.forward(ctx, xm), ym);
    (it == 0 ? first : last) = loss.item();
    opt.zero_grad();
    {
      auto scaled = amp::scale_loss(loss, opt);
      scaled.backward();
    }
    opt.step();
  }
  std::printf("%s: loss %.4f -> %.4f\n", std::string(amp::policy_name<P>()).c_str(), first, last);
  return last < 0.9f * first;
}

int main() {
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::vector<float> x(32 * 256), y(32 * 128);
  for (auto& v : x) v = normal(gen);
  for (auto& v : y) v = normal(gen);
  amp::Context<amp::host> ctx;
  const bool ok = train<amp::O0Policy>(ctx, x, y) && train<amp::O2BF16Policy>(ctx, x, y);
  if (ok) std::printf("consumer OK (CPU only, %d threads)\n", ctx.threads());
  return ok ? 0 : 1;
}
