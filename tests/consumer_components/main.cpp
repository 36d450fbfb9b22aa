// Uses each component it was built with, through that component's headers only.
#include <amp/core/numeric.hpp>
#include <amp/policy.hpp>
#if defined(AMP_WANT_HOST)
#include <amp/backend/host.hpp>
#include <amp/nn/linear.hpp>
#include <amp/nn/loss.hpp>
#include <amp/nn/sequential.hpp>
#include <amp/optim/sgd.hpp>
#include <amp/train.hpp>
#endif
#if defined(AMP_WANT_DATA)
#include <amp/data/idx.hpp>
#endif
#if defined(AMP_WANT_CUDA)
#include <amp/backend/cuda.cuh>
#endif
#if defined(AMP_WANT_PARALLEL)
#include <amp/parallel.hpp>
#endif

#include <cstdio>
#include <string>
#include <vector>

int main() {
  static_assert(std::is_same_v<amp::O2Policy::param_type, amp::half>);
  if (amp::cast<float>(amp::cast<amp::bfloat16>(1.5f)) != 1.5f) return 1;
  std::string used = "core";
#if defined(AMP_WANT_HOST)
  amp::Context<amp::host> ctx;
  amp::nn::Sequential<amp::O2BF16Policy, amp::host, amp::nn::Linear> model(ctx, {.max_batch = 4, .seed = 1},
                                                                          {.in_features = 8, .out_features = 2});
  amp::optim::SGD<amp::O2BF16Policy, amp::host> opt(model.parameters(), {.lr = 0.1f});
  std::vector<float> x(4 * 8, 0.5f), y(4 * 2, 1.0f);
  float first = 0, last = 0;
  for (int it = 0; it < 20; ++it) {
    auto loss = amp::nn::mse_loss(ctx, model.forward(ctx, amp::matrix<const float>(x.data(), 4, 8)),
                                  amp::matrix<const float>(y.data(), 4, 2));
    (it == 0 ? first : last) = loss.item();
    opt.zero_grad();
    {
      auto scaled = amp::scale_loss(loss, opt);
      scaled.backward();
    }
    opt.step();
  }
  if (!(last < 0.5f * first)) return 1;
  used += " host";
#endif
#if defined(AMP_WANT_DATA)
  try {
    amp::data::read_idx("/nonexistent/amp-consumer.idx", 3);
    return 1;
  } catch (const amp::Error& e) {
    if (std::string(e.what()).find("/nonexistent/amp-consumer.idx") == std::string::npos) return 1;
  }
  used += " data";
#endif
#if defined(AMP_WANT_CUDA)
  used += amp::cuda_device_count() > 0 ? " cuda" : " cuda (no GPU: built only)";
#endif
#if defined(AMP_WANT_PARALLEL)
  static_assert(sizeof(amp::parallel::MpiCommunicator) > 0);
  used += " parallel (built only)";
#endif
  std::printf("consumer OK (components: %s)\n", used.c_str());
  return 0;
}
