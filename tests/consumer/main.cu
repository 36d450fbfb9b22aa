// The CUDA side of the contract compiles in a consumer too (it runs only on a GPU).
#include <amp/amp.hpp>

int main() {
  if (amp::cuda_device_count() == 0) return 0;
  amp::Context<amp::cuda> ctx(0, amp::O1Policy{});
  amp::Buffer<amp::half, amp::cuda> b(ctx, 16, amp::memory_kind::weights);
  return b.size() == 16 ? 0 : 1;
}
