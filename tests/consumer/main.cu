// The CUDA side of the contract compiles in a consumer too (it runs only on a GPU).
#include <amp/amp.hpp>

#include <cstdio>

int main() {
  if (amp::cuda_device_count() == 0) {
    std::printf("consumer OK (no GPU: built only)\n");
    return 0;
  }
  amp::Context<amp::cuda> ctx(0, amp::O1Policy{});
  amp::Buffer<amp::half, amp::cuda> b(ctx, 16, amp::memory_kind::weights);
  std::printf("consumer OK (GPU %s)\n", ctx.device_name().c_str());
  return b.size() == 16 ? 0 : 1;
}
